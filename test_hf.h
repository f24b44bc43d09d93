/*
test_hf.h: the tests of hf.h (fla / Hugging Face export and import), included by test_pdn.c (fp32 build) and run by
run_hf_tests(). Uses test_pdn.c's CHECK, run_cmd, files_equal and write_bytes. Everything happens in a directory of
its own (mkdtemp), so two test runs side by side do not meet.
  - export -> import is bit-exact (fp32) for every variant, tied and untied, with non-default constants
  - bf16 export rounds to nearest even (hand cases, and every exported value against an independent rounding)
  - safetensors: a file built here from the format's description reads back; the writer's bytes equal a file
    built by hand; malformed files are refused with their reason
  - the exported key set and shapes equal the lists written below from fla's layer code (2 layers, each variant)
  - config.json: fla's defaults for absent fields; what pdn.c cannot represent is refused with a reason
  - tokenizer files: vocab.json/merges.txt reload as the same vocabulary (a train_bpe one; GPT-2's if ../shared has
    it, byte-identical to the published files); padding vocabulary rows are dropped
  - the command line: --export-hf / --import-hf, and an imported checkpoint continues training with -e
*/

static char hf_base[64];

// the test shape: every dimension different so a swapped axis shows (d 40, H 3, K 8, V 16, I 72, conv 3, vocab 37)
static PdnConfig hf_config(const char* variant, int tie) {
    PdnConfig c;
    pdn_config_defaults(&c);
    pdn_variant_apply(&c, variant);
    c.vocab_size = 37; c.d_model = 40; c.n_layer = 2; c.n_head = 3; c.head_k = 8; c.expand_v = 2; c.mlp_hidden = 72;
    c.conv_size = 3; c.tie_embeddings = tie;
    // constants away from their defaults, so that the config round trip is seen to carry them
    c.norm_eps = 1e-5f; c.squash_x = 1.25f; c.precond_eps = 3e-6f; c.log_atk_scale_init = -0.3f; c.a_log_lo = 0.5f;
    c.neg_eigval = strcmp(variant, "pgdn") == 0;
    const char* err = pdn_config_check(&c);
    if (err) { printf("bad test config: %s\n", err); exit(1); }
    return c;
}

// random parameters of every tensor, with values that need all 24 bits of an fp32 significand
static float* hf_params(const PdnConfig* c, PdnLayout* lay, uint64_t seed) {
    pdn_build_layout(c, lay);
    float* p = (float*)mallocCheck(lay->num_elems * sizeof(float));
    pdn_init_params(c, lay, p, seed);
    Rng r;
    rng_seed(&r, seed);
    for (int i = 0; i < NUM_TENSORS; i++) {
        for (size_t j = 0; j < lay->t[i].numel; j++) { p[lay->t[i].offset + j] += (float)(0.1 * (rng_uniform(&r) - 0.5)); }
    }
    return p;
}

static int hf_same_config(const PdnConfig* a, const PdnConfig* b) {
    PdnConfig x = *a, y = *b;
    x.ridge = y.ridge = 0;   // the exact preconditioner's ridge: no fla class has one, and none is exported
    return memcmp(&x, &y, sizeof x) == 0;
}

static void test_hf_roundtrip(void) {
    const char* variants[] = {"dn", "pdn", "gdn", "pgdn", "kda", "pkda", "kda", "pkda"};   // the last two: --out-gate 0
    int ok = 0;
    for (int v = 0; v < 8; v++) {
        for (int tie = 0; tie < 2; tie++) {
            PdnConfig c = hf_config(variants[v], tie), c2;
            if (v >= 6) { c.out_gate = 0; }
            PdnLayout lay;
            float* p = hf_params(&c, &lay, 100 + v * 2 + tie);
            char dir[128];
            snprintf(dir, sizeof dir, "%s/rt_%d_%d", hf_base, v, tie);
            int cls, rows, ign;
            hf_export(dir, &c, p, 0, NULL, &cls, &rows);
            float* q;
            hf_import(dir, &c2, &q, &ign);
            int same = hf_same_config(&c, &c2) && memcmp(p, q, lay.num_elems * sizeof(float)) == 0;
            CHECK(same, "%s tie %d: export -> import is not bit-exact (config %s)", variants[v], tie,
                  hf_same_config(&c, &c2) ? "same" : "differs");
            ok += same;
            free(p); free(q);
        }
    }
    printf("  export -> import bit-exact (fp32): %d of 16 (6 variants and kda/pkda with --out-gate 0, tied and untied, "
           "non-default constants)\n", ok);
}

// ---- bf16 rounding

// the bf16 nearest to x, ties to the even significand, computed independently (in double, by candidates)
static uint16_t bf16_nearest(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);   // truncation, and the next bf16 away from zero
    double dlo = fabs((double)bf16_to_float(lo) - x), dhi = fabs((double)bf16_to_float(hi) - x);
    if ((u & 0xFFFF) == 0) { return lo; }
    if (dlo < dhi) { return lo; }
    if (dhi < dlo) { return hi; }
    return (lo & 1) ? hi : lo;
}

static void test_hf_bf16(void) {
    // hand cases: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 (ties to 1, even); 1 + 3*2^-8 between 1 + 2^-7 and
    // 1 + 2^-6 (ties to the even 0x3F82); just above a tie rounds up; the largest float overflows to inf
    struct { float x; uint16_t want; } hc[] = {
        {1.0f, 0x3F80}, {1.0f + 0.00390625f, 0x3F80}, {1.0f + 3 * 0.00390625f, 0x3F82}, {1.0f + 0.00390625f + 1.1920929e-7f, 0x3F81},
        {-1.0f - 0.00390625f, 0xBF80}, {-INFINITY, 0xFF80}, {INFINITY, 0x7F80}, {3.4028235e38f, 0x7F80}, {0.0f, 0x0000},
        {-0.0f, 0x8000}, {1e-40f, 0x0001},   // 1e-40 = 0x000116C2: a subnormal, nearest bf16 0x0001
    };
    int bad = 0;
    for (size_t i = 0; i < sizeof(hc) / sizeof(hc[0]); i++) {
        uint16_t got = float_to_bf16_rne(hc[i].x);
        CHECK(got == hc[i].want, "bf16(%a) = 0x%04X, want 0x%04X", (double)hc[i].x, got, hc[i].want);
        bad += got != hc[i].want;
    }
    uint16_t nan = float_to_bf16_rne(NAN);
    CHECK((nan & 0x7F80) == 0x7F80 && (nan & 0x7F), "bf16(NaN) = 0x%04X is not a NaN", nan);
    // an exported checkpoint: every stored value is the nearest bf16 of the fp32 parameter
    PdnConfig c = hf_config("pkda", 0), c2;
    PdnLayout lay;
    float* p = hf_params(&c, &lay, 7);
    char dir[128], path[160];
    snprintf(dir, sizeof dir, "%s/bf16", hf_base);
    int cls, rows, ign;
    hf_export(dir, &c, p, 1, NULL, &cls, &rows);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    StFile st;
    const char* err = st_open(&st, path);
    CHECK(!err, "bf16 export does not open: %s", err ? err : "");
    size_t checked = 0, wrong = 0;
    HfTensor* ht = (HfTensor*)mallocCheck((3 + 32 * (size_t)c.n_layer) * sizeof(HfTensor));
    int n = hf_tensors(&c, HF_PKDA, c.vocab_size, ht);
    for (int i = 0; !err && i < n; i++) {
        const StEntry* e = st_find(&st, ht[i].name);
        CHECK(e && strcmp(ST_DTYPES[e->dtype].name, "BF16") == 0, "%s: not BF16 in the bf16 export", ht[i].name);
        if (!e) { continue; }
        size_t m = (size_t)(e->end - e->begin) / 2;
        uint8_t* raw = (uint8_t*)mallocCheck(2 * m);
        fseeko(st.f, (off_t)(8 + st.header_len + e->begin), SEEK_SET);
        freadCheck(raw, 2, m, st.f, path);
        const float* src = PDN_PARAM(p, &lay, ht[i].id, ht[i].layer < 0 ? 0 : ht[i].layer);
        for (size_t j = 0; j < m; j++) { wrong += (uint16_t)(raw[2 * j] | raw[2 * j + 1] << 8) != bf16_nearest(src[j]); checked++; }
        free(raw);
    }
    if (!err) { st_close(&st); }
    CHECK(wrong == 0 && checked == lay.num_params, "bf16 export: %zu of %zu values are not the nearest bf16 (ties to even)", wrong, checked);
    // and import reads them back as exactly those bf16 values
    float* q;
    hf_import(dir, &c2, &q, &ign);
    size_t diff = 0;
    for (size_t i = 0; i < lay.num_elems; i++) { diff += q[i] != bf16_to_float(float_to_bf16_rne(p[i])); }
    CHECK(diff == 0 && hf_same_config(&c, &c2), "bf16 import: %zu values differ from the rounded parameters", diff);
    printf("  bf16: %zu hand cases, %zu exported values are the nearest bf16 (ties to even), import reads them back\n",
           sizeof(hc) / sizeof(hc[0]) - (size_t)bad, checked - wrong);
    free(ht); free(p); free(q);
}

// ---- safetensors against the format's description

// a file: 8-byte little-endian header length (hlen, or the real length if hlen < 0), the header text, the data
static void st_handmade(const char* path, const char* header, long long hlen, const uint8_t* data, size_t n) {
    size_t hl = strlen(header);
    uint8_t* b = (uint8_t*)mallocCheck(8 + hl + n + 1);
    unsigned long long L = hlen < 0 ? (unsigned long long)hl : (unsigned long long)hlen;
    for (int k = 0; k < 8; k++) { b[k] = (uint8_t)(L >> (8 * k)); }
    memcpy(b + 8, header, hl);
    if (n) { memcpy(b + 8 + hl, data, n); }
    write_bytes(path, b, 8 + hl + n);
    free(b);
}

static void test_safetensors_format(void) {
    char path[160];
    snprintf(path, sizeof path, "%s/hand.safetensors", hf_base);
    // three tensors, written out byte by byte: a F32 [2] = {1, -2.5}, b BF16 [1, 2] = {1, -inf},
    // c F16 [3] = {1, 2^-24 (the smallest subnormal), -65504 (the most negative finite)}; listed out of order
    const uint8_t data[] = {0x00, 0x00, 0x80, 0x3F, 0x00, 0x00, 0x20, 0xC0,   0x80, 0x3F, 0x80, 0xFF,
                            0x00, 0x3C, 0x01, 0x00, 0xFF, 0xFB};
    const char* hdr = "{\"c\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[12,18]},\"__metadata__\":{\"format\":\"pt\"},"
                      "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                      "\"b\":{\"dtype\":\"BF16\",\"shape\":[1,2],\"data_offsets\":[8,12]}}  ";
    st_handmade(path, hdr, -1, data, sizeof data);
    StFile st;
    const char* err = st_open(&st, path);
    CHECK(!err, "hand-built file refused: %s", err ? err : "");
    if (!err) {
        float a[2], b[2], c[3];
        long long sa[1] = {2}, sb[2] = {1, 2}, sc[1] = {3};
        const char *ea = st_read(&st, "a", 1, sa, a), *eb = st_read(&st, "b", 2, sb, b), *ec = st_read(&st, "c", 1, sc, c);
        CHECK(!ea && !eb && !ec && a[0] == 1.0f && a[1] == -2.5f && b[0] == 1.0f && b[1] == -INFINITY && c[0] == 1.0f &&
              c[1] == ldexpf(1.0f, -24) && c[2] == -65504.0f && st.format_pt && st.n == 3,
              "hand-built file read wrong: %s %s %s / %g %g %g %g %g %g %g", ea ? ea : "", eb ? eb : "", ec ? ec : "",
              a[0], a[1], b[0], b[1], c[0], c[1], c[2]);
        long long wrong[1] = {3};
        const char* e2 = st_read(&st, "a", 1, wrong, a);
        CHECK(e2 && strstr(e2, "has shape [2], the config needs [3]"), "wrong shape not refused: %s", e2 ? e2 : "(accepted)");
        st_close(&st);
    }
    // the writer, against the bytes the format prescribes for two tensors (the header padded with spaces to 8)
    float x[2] = {1.0f, -2.5f};
    StOut so[2] = {{"x", 2, {2, 1}, x, 0}, {"y.z", 1, {1}, NULL, -INFINITY}};
    st_write(path, so, 2, 0);
    const char* want_hdr = "{\"__metadata__\":{\"format\":\"pt\"},\"x\":{\"dtype\":\"F32\",\"shape\":[2,1],\"data_offsets\":[0,8]},"
                           "\"y.z\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}";
    size_t hl = strlen(want_hdr), padded = (hl + 7) / 8 * 8;
    uint8_t want[512];
    for (int k = 0; k < 8; k++) { want[k] = (uint8_t)((unsigned long long)padded >> (8 * k)); }
    memcpy(want + 8, want_hdr, hl);
    memset(want + 8 + hl, ' ', padded - hl);
    const uint8_t wdata[] = {0x00, 0x00, 0x80, 0x3F, 0x00, 0x00, 0x20, 0xC0, 0x00, 0x00, 0x80, 0xFF};
    memcpy(want + 8 + padded, wdata, sizeof wdata);
    size_t gn;
    uint8_t* got = slurp_file(path, &gn);
    CHECK(gn == 8 + padded + sizeof wdata && memcmp(got, want, gn) == 0, "st_write's bytes differ from the hand-built file");
    free(got);
    // malformed files, each refused with its reason
    struct { const char* what; const char* hdr; long long hlen; size_t ndata; const char* reason; } bad[] = {
        {"5-byte file", NULL, 0, 0, "too short"},
        {"header length past the end", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 1000, 4, "runs past the end"},
        {"header length 0", "{}", 0, 0, "bad header length"},
        {"header length 2^62", "{}", 1ll << 62, 0, "bad header length"},
        {"header not JSON", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]", -1, 4, "invalid JSON"},
        {"not an object", "[1,2,3]", -1, 0, "does not start with '{'"},
        {"unknown dtype", "{\"a\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}", -1, 4, "unknown dtype"},
        {"overlapping offsets", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                                "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", -1, 8, "overlap"},
        {"a hole", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                   "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", -1, 12, "a hole"},
        {"out-of-range offsets", "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", -1, 8, "past the end"},
        {"offsets not matching the shape", "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", -1, 8, "do not match"},
        {"negative offset", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", -1, 0, "not integers"},
        {"trailing bytes", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", -1, 8, "belong to no tensor"},
        {"a name twice", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                         "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", -1, 8, "appears twice"},
        {"no shape", "{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", -1, 4, "dtype, shape and data_offsets"},
    };
    uint8_t zeros[16] = {0};
    int refused = 0;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        if (!bad[i].hdr) { write_bytes(path, zeros, 5); }
        else { st_handmade(path, bad[i].hdr, bad[i].hlen, zeros, bad[i].ndata); }
        err = st_open(&st, path);
        CHECK(err && strstr(err, bad[i].reason), "%s: %s (want a reason containing '%s')", bad[i].what,
              err ? err : "accepted", bad[i].reason);
        if (!err) { st_close(&st); } else { refused++; }
    }
    // a readable file whose tensor has a dtype pdn.c does not read
    st_handmade(path, "{\"a\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]}}", -1, zeros, 4);
    err = st_open(&st, path);
    if (!err) {
        float v;
        long long s1[1] = {1};
        const char* e2 = st_read(&st, "a", 1, s1, &v);
        CHECK(e2 && strstr(e2, "pdn.c reads F32, BF16 or F16"), "I32 tensor read: %s", e2 ? e2 : "accepted");
        e2 = st_read(&st, "b", 1, s1, &v);
        CHECK(e2 && strstr(e2, "missing"), "missing tensor: %s", e2 ? e2 : "accepted");
        st_close(&st);
    }
    printf("  safetensors: a hand-built F32/BF16/F16 file reads back, the writer's bytes equal the hand-built ones, "
           "%d malformed files refused with their reason\n", refused);
}

// ---- the key set against fla's layer code (fla/layers/*.py, fla/models/*/modeling_*.py at bc3b101d), for the
// hf_config shape: d 40, H 3, K 8, V 16 (head_v_dim), H*K 24, H*V 48, I 72, conv 3, vocab 37, untied

static const char* const FLA_GLOBAL[] = {"model.embeddings.weight 37x40", "model.norm.weight 40", "lm_head.weight 37x40", NULL};
static const char* const FLA_BLOCK[] = {   // GatedMLP and the two RMSNorms of every block
    "attn_norm.weight 40", "mlp_norm.weight 40", "mlp.gate_proj.weight 72x40", "mlp.up_proj.weight 72x40",
    "mlp.down_proj.weight 40x72", NULL};
static const char* const FLA_DELTA_NET[] = {   // layers/delta_net.py (use_beta, use_short_conv, no use_gate)
    "attn.q_proj.weight 24x40", "attn.k_proj.weight 24x40", "attn.v_proj.weight 48x40", "attn.b_proj.weight 3x40",
    "attn.q_conv1d.weight 24x1x3", "attn.k_conv1d.weight 24x1x3", "attn.v_conv1d.weight 48x1x3", "attn.o_norm.weight 16",
    "attn.o_proj.weight 40x48", NULL};
static const char* const FLA_GATED_DELTANET[] = {   // layers/gated_deltanet.py (use_gate false)
    "attn.q_proj.weight 24x40", "attn.k_proj.weight 24x40", "attn.v_proj.weight 48x40", "attn.a_proj.weight 3x40",
    "attn.b_proj.weight 3x40", "attn.A_log 3", "attn.dt_bias 3", "attn.q_conv1d.weight 24x1x3", "attn.k_conv1d.weight 24x1x3",
    "attn.v_conv1d.weight 48x1x3", "attn.o_norm.weight 16", "attn.o_proj.weight 40x48", NULL};
static const char* const FLA_PRECOND_GATED_DELTANET[] = {   // layers/precond_gated_deltanet.py (use_gate false)
    "attn.q_proj.weight 24x40", "attn.k_proj.weight 24x40", "attn.v_proj.weight 48x40", "attn.a_proj.weight 3x40",
    "attn.b_proj.weight 3x40", "attn.a_atk_proj.weight 3x40", "attn.b_atk_proj.weight 3x40", "attn.log_atk_scale 3",
    "attn.A_log 3", "attn.dt_bias 3", "attn.A_log_atk 3", "attn.dt_bias_atk 3", "attn.q_conv1d.weight 24x1x3",
    "attn.k_conv1d.weight 24x1x3", "attn.v_conv1d.weight 48x1x3", "attn.o_norm.weight 16", "attn.o_proj.weight 40x48", NULL};
static const char* const FLA_KDA[] = {   // layers/kda.py: f_proj, g_proj = Sequential(Linear(d, V), Linear(V, ...))
    "attn.q_proj.weight 24x40", "attn.k_proj.weight 24x40", "attn.v_proj.weight 48x40", "attn.q_conv1d.weight 24x1x3",
    "attn.k_conv1d.weight 24x1x3", "attn.v_conv1d.weight 48x1x3", "attn.f_proj.0.weight 16x40", "attn.f_proj.1.weight 24x16",
    "attn.b_proj.weight 3x40", "attn.A_log 3", "attn.dt_bias 24", "attn.g_proj.0.weight 16x40", "attn.g_proj.1.weight 48x16",
    "attn.g_proj.1.bias 48", "attn.o_norm.weight 16", "attn.o_proj.weight 40x48", NULL};
static const char* const FLA_PRECOND_KDA[] = {   // layers/precond_kda.py: a_proj is the preconditioner's gate here
    "attn.q_proj.weight 24x40", "attn.k_proj.weight 24x40", "attn.v_proj.weight 48x40", "attn.a_proj.weight 3x40",
    "attn.f_proj.0.weight 16x40", "attn.f_proj.1.weight 24x16", "attn.b_atk_proj.weight 3x40", "attn.b_proj.weight 3x40",
    "attn.A_log_atk 3", "attn.dt_bias_atk 3", "attn.A_log 3", "attn.dt_bias 24", "attn.log_atk_scale 3",
    "attn.q_conv1d.weight 24x1x3", "attn.k_conv1d.weight 24x1x3", "attn.v_conv1d.weight 48x1x3",
    "attn.g_proj.0.weight 16x40", "attn.g_proj.1.weight 48x16", "attn.g_proj.1.bias 48", "attn.o_norm.weight 16",
    "attn.o_proj.weight 40x48", NULL};

static void test_hf_keys(void) {
    struct { const char* variant; const char* const* layer; const char* model_type; } cases[] = {
        {"dn", FLA_DELTA_NET, "delta_net"}, {"pdn", FLA_PRECOND_GATED_DELTANET, "precond_gated_deltanet"},
        {"gdn", FLA_GATED_DELTANET, "gated_deltanet"}, {"pgdn", FLA_PRECOND_GATED_DELTANET, "precond_gated_deltanet"},
        {"kda", FLA_KDA, "kda"}, {"pkda", FLA_PRECOND_KDA, "precond_kda"},
        {"kda-gate", FLA_KDA, "kda"}, {"pkda-gate", FLA_PRECOND_KDA, "precond_kda"},   // --out-gate 0: the same keys
    };
    for (size_t v = 0; v < sizeof(cases) / sizeof(cases[0]); v++) {
        for (int tie = 0; tie < 2; tie++) {
            char base[16];
            snprintf(base, sizeof base, "%.*s", (int)strcspn(cases[v].variant, "-"), cases[v].variant);
            PdnConfig c = hf_config(base, tie);
            if (strchr(cases[v].variant, '-')) { c.out_gate = 0; }
            PdnLayout lay;
            float* p = hf_params(&c, &lay, 3);
            char dir[128], path[160];
            snprintf(dir, sizeof dir, "%s/keys_%s_%d", hf_base, cases[v].variant, tie);
            int cls, rows;
            hf_export(dir, &c, p, 0, NULL, &cls, &rows);
            free(p);
            // the expected list: globals (lm_head only untied), then per layer the block's and the mixer's keys
            char want[128][96];
            int nw = 0;
            for (int i = 0; FLA_GLOBAL[i]; i++) {
                if (!(tie && strncmp(FLA_GLOBAL[i], "lm_head", 7) == 0)) { snprintf(want[nw++], 96, "%s", FLA_GLOBAL[i]); }
            }
            for (int l = 0; l < 2; l++) {
                for (int i = 0; FLA_BLOCK[i]; i++) { snprintf(want[nw++], 96, "model.layers.%d.%s", l, FLA_BLOCK[i]); }
                for (int i = 0; cases[v].layer[i]; i++) { snprintf(want[nw++], 96, "model.layers.%d.%s", l, cases[v].layer[i]); }
            }
            snprintf(path, sizeof path, "%s/model.safetensors", dir);
            StFile st;
            const char* err = st_open(&st, path);
            CHECK(!err, "%s: export does not open: %s", cases[v].variant, err ? err : "");
            if (err) { continue; }
            int found = 0;
            for (int i = 0; i < nw; i++) {
                char name[96], shape[32], got[32] = "";
                sscanf(want[i], "%95s %31s", name, shape);
                const StEntry* e = st_find(&st, name);
                for (int k = 0; e && k < e->ndim; k++) { snprintf(got + strlen(got), sizeof got - strlen(got), k ? "x%lld" : "%lld", e->shape[k]); }
                CHECK(e && strcmp(got, shape) == 0, "%s tie %d: %s is %s, fla has %s", cases[v].variant, tie, name,
                      e ? got : "missing", shape);
                found += e && strcmp(got, shape) == 0;
            }
            CHECK(found == nw && st.n == nw, "%s tie %d: %d tensors exported, fla's list has %d", cases[v].variant, tie, st.n, nw);
            st_close(&st);
            snprintf(path, sizeof path, "%s/config.json", dir);
            size_t n;
            char* text = (char*)slurp_file(path, &n);
            char mt[96];
            snprintf(mt, sizeof mt, "\"model_type\": \"%s\"", cases[v].model_type);
            CHECK(strstr(text, mt) && strstr(text, tie ? "\"tie_word_embeddings\": true" : "\"tie_word_embeddings\": false"),
                  "%s: config.json lacks %s or the tie flag", cases[v].variant, mt);
            free(text);
        }
    }
    // at the paper's sizes the fla tensors add up to MODEL.md §7's counts (fla's models have exactly these parameters;
    // pdn's export is a PGDN, so it has PGDN's count: the main-decay tensors it adds are the only difference)
    struct { const char* preset; long long count; } sizes[] = {
        {"dn-340m", 341594112}, {"pdn-340m", 342184896}, {"gdn-340m", 341791104}, {"pgdn-340m", 342184896},
        {"kda-340m", 354226368}, {"pkda-340m", 354620160}, {"pgdn-1b", 996215184}, {"pkda-1b", 996392064},
    };
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        PdnConfig c;
        pdn_config_defaults(&c);
        pdn_preset_apply(&c, sizes[i].preset);
        pdn_config_check(&c);
        const char* why;
        int cls = hf_class_of(&c, &why);
        HfTensor* ht = (HfTensor*)mallocCheck((3 + 32 * (size_t)c.n_layer) * sizeof(HfTensor));
        int n = hf_tensors(&c, cls, c.vocab_size, ht);
        long long total = 0;
        for (int k = 0; k < n; k++) {
            long long e = 1;
            for (int j = 0; j < ht[k].ndim; j++) { e *= ht[k].shape[j]; }
            total += e;
        }
        CHECK(total == sizes[i].count, "%s: the fla tensors hold %lld parameters, MODEL.md §7 says %lld", sizes[i].preset, total, sizes[i].count);
        free(ht);
    }
    printf("  exported keys and shapes = fla's layer code for a 2-layer model of each of the 6 variants (and kda/pkda "
           "with --out-gate 0), tied and untied; "
           "at the paper's sizes they add up to MODEL.md §7's counts (%zu presets)\n", sizeof(sizes) / sizeof(sizes[0]));
}

// ---- config.json: fla's defaults and the refusals

static void test_hf_config(void) {
    // absent fields take fla's class defaults: gated_deltanet expand_v 2.0, conv_size 4, norm_eps 1e-6, untied, and
    // intermediate_size null -> 256 * ceil(int(40 * 4 * 2/3) / 256) = 256
    const char* cfg = "{\"model_type\": \"gated_deltanet\", \"hidden_size\": 40, \"num_heads\": 3, \"head_dim\": 8, "
                      "\"num_hidden_layers\": 2, \"vocab_size\": 37, \"use_gate\": false, \"intermediate_size\": null}";
    PdnConfig c;
    int cls;
    const char* err = hf_read_config(cfg, strlen(cfg), &c, &cls);
    CHECK(!err && cls == HF_GDN && c.expand_v == 2 && c.conv_size == 4 && c.norm_eps == 1e-6f && !c.tie_embeddings &&
          c.mlp_hidden == 256 && c.decay == DECAY_SCALAR && c.precond == PRECOND_NONE && !c.out_gate && !c.neg_eigval,
          "gated_deltanet defaults: %s (expand_v %d conv %d eps %g tie %d I %d)", err ? err : "ok", c.expand_v, c.conv_size,
          c.norm_eps, c.tie_embeddings, c.mlp_hidden);
    // precond_kda with only its shape: K 128, 16 heads, 24 layers, vocab 32000, squash 1.5 / 1e-6, a_log_init_lower 1
    const char* cfg2 = "{\"model_type\": \"precond_kda\", \"hidden_size\": 64}";
    err = hf_read_config(cfg2, strlen(cfg2), &c, &cls);
    CHECK(!err && cls == HF_PKDA && c.head_k == 128 && c.n_head == 16 && c.n_layer == 24 && c.vocab_size == 32000 &&
          c.expand_v == 1 && c.squash_x == 1.5f && c.precond_eps == 1e-6f && c.a_log_lo == 1.0f && c.out_gate &&
          c.decay == DECAY_CHANNEL && c.precond == PRECOND_DIAG && c.mlp_hidden == 256,
          "precond_kda defaults: %s", err ? err : "ok");
    // delta_net: heads sized by hidden_size (expand_k 0.5 -> key_dim 32 -> head_k 8 over 4 heads)
    const char* cfg3 = "{\"model_type\": \"delta_net\", \"hidden_size\": 64, \"num_heads\": 4, \"expand_k\": 0.5}";
    err = hf_read_config(cfg3, strlen(cfg3), &c, &cls);
    CHECK(!err && cls == HF_DN && c.head_k == 8 && c.expand_v == 2 && c.decay == DECAY_NONE && c.n_layer == 24,
          "delta_net sizes: %s (K %d, expand_v %d)", err ? err : "ok", c.head_k, c.expand_v);
    struct { const char* json; const char* reason; } bad[] = {
        {"{\"model_type\": \"llama\"}", "not one pdn.c can read"},
        {"{\"model_type\": \"gated_deltanet\"}", "use_gate true"},   // fla's default for GDN is use_gate true
        {"{\"model_type\": \"precond_gated_deltanet\", \"use_gate\": true}", "use_gate true"},
        {"{\"model_type\": \"gated_deltanet\", \"use_gate\": false, \"num_heads\": 2, \"num_v_heads\": 4}", "grouped value"},
        {"{\"model_type\": \"kda\", \"safe_gate\": true, \"lower_bound\": -5.0}", "lower_bound"},
        {"{\"model_type\": \"kda\", \"attn\": {\"layers\": [1], \"num_heads\": 4, \"qkv_bias\": true}}", "qkv_bias true"},
        {"{\"model_type\": \"kda\", \"use_short_conv\": false}", "short conv"},
        {"{\"model_type\": \"kda\", \"hidden_act\": \"powlu\"}", "swish"},
        {"{\"model_type\": \"kda\", \"expand_v\": 1.5}", "integer expand_v"},
        {"{\"model_type\": \"delta_net\", \"qk_norm\": \"sum\"}", "qk_norm"},
        {"{\"model_type\": \"kda\", \"hidden_size\": \"big\"}", "must be an integer"},
        {"{\"model_type\": \"kda\", \"vocab_size\": 1}", "--vocab must be in 2.."},
        {"{\"model_type\": \"kda\",}", "invalid JSON"},
    };
    int refused = 0;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err = hf_read_config(bad[i].json, strlen(bad[i].json), &c, &cls);
        CHECK(err && strstr(err, bad[i].reason), "config %s: %s (want '%s')", bad[i].json, err ? err : "accepted", bad[i].reason);
        refused += err != NULL;
    }
    // what pdn.c has and fla does not, refused at export (exit 1 with the reason)
    PdnConfig x = hf_config("pgdn", 1);
    const char* why;
    x.precond = PRECOND_EXACT;
    CHECK(hf_class_of(&x, &why) < 0 && strstr(why, "exact"), "--precond exact exported");
    x = hf_config("gdn", 1); x.out_gate = 1;
    CHECK(hf_class_of(&x, &why) < 0 && strstr(why, "swish"), "gdn with pdn.c's output gate exported");
    printf("  config.json: fla's defaults for absent fields (gated_deltanet, precond_kda, delta_net); %d configs pdn.c "
           "cannot represent refused with the reason; 2 pdn.c options fla lacks refused at export\n", refused);
}

// ---- hybrids (issue 19): attention layers as fla's Attention, named and configured as fla's hybrid "attn" spec

static const char* const FLA_ATTN[] = {   // layers/attn.py with hidden 40, 4 heads of 10, 2 kv heads, no bias
    "attn.q_proj.weight 40x40", "attn.k_proj.weight 20x40", "attn.v_proj.weight 20x40", "attn.o_proj.weight 40x40", NULL};

static void test_hf_hybrid(void) {
    // pgdn with attention at layer 1 (GQA, window 7, theta 5e5); kda with attention at layer 0 (full causal, kv = q)
    PdnConfig c = hf_config("pgdn", 0), k = hf_config("kda", 1), c2;
    c.attn_layers.w[0] = 2; c.attn_heads = 4; c.attn_kv_heads = 2; c.attn_window = 7; c.rope_theta = 500000.0f;
    k.attn_layers.w[0] = 1; k.attn_heads = 4;
    CHECK(!pdn_config_check(&c) && !pdn_config_check(&k), "hybrid test configs invalid");
    PdnConfig* cfgs[2] = {&c, &k};
    int same = 0;
    for (int i = 0; i < 2; i++) {
        PdnLayout lay;
        float* p = hf_params(cfgs[i], &lay, 40 + i);
        char dir[128];
        snprintf(dir, sizeof dir, "%s/hyb_%d", hf_base, i);
        int cls, rows, ign;
        hf_export(dir, cfgs[i], p, 0, NULL, &cls, &rows);
        float* q;
        hf_import(dir, &c2, &q, &ign);
        int ok = hf_same_config(cfgs[i], &c2) && memcmp(p, q, lay.num_elems * sizeof(float)) == 0;
        CHECK(ok, "hybrid %d: export -> import is not bit-exact (config %s)", i, hf_same_config(cfgs[i], &c2) ? "same" : "differs");
        same += ok;
        free(p); free(q);
    }
    // the pgdn hybrid's keys: layer 0 a PGDN block, layer 1 an attention block; config.json's "attn"
    char path[160];
    snprintf(path, sizeof path, "%s/hyb_0/model.safetensors", hf_base);
    StFile st;
    const char* err = st_open(&st, path);
    CHECK(!err, "hybrid export does not open: %s", err ? err : "");
    int found = 0, nw = 0;
    for (int l = -1; !err && l < 2; l++) {
        const char* const* lists[2] = {l < 0 ? FLA_GLOBAL : FLA_BLOCK, l < 0 ? NULL : l == 0 ? FLA_PRECOND_GATED_DELTANET : FLA_ATTN};
        for (int s = 0; s < 2; s++) {
            for (int i = 0; lists[s] && lists[s][i]; i++) {
                char name[96], shape[32], full[120], got[32] = "";
                sscanf(lists[s][i], "%95s %31s", name, shape);
                if (l < 0) { snprintf(full, sizeof full, "%s", name); } else { snprintf(full, sizeof full, "model.layers.%d.%s", l, name); }
                const StEntry* e = st_find(&st, full);
                for (int d = 0; e && d < e->ndim; d++) { snprintf(got + strlen(got), sizeof got - strlen(got), d ? "x%lld" : "%lld", e->shape[d]); }
                CHECK(e && strcmp(got, shape) == 0, "hybrid: %s is %s, fla has %s", full, e ? got : "missing", shape);
                found += e && strcmp(got, shape) == 0;
                nw++;
            }
        }
    }
    if (!err) {
        CHECK(found == nw && st.n == nw, "hybrid: %d tensors exported, fla's list has %d", st.n, nw);
        st_close(&st);
    }
    snprintf(path, sizeof path, "%s/hyb_0/config.json", hf_base);
    size_t n;
    char* text = (char*)slurp_file(path, &n);
    const char* want[] = {"\"attn\": {\n    \"layers\": [1],\n    \"num_heads\": 4,\n    \"num_kv_heads\": 2,\n    "
                          "\"qkv_bias\": false,\n    \"window_size\": 7,\n    \"rope_theta\": 500000.0\n  },"};
    CHECK(strstr(text, want[0]) != NULL, "hybrid config.json lacks fla's attn spec:\n%s", text);
    free(text);
    snprintf(path, sizeof path, "%s/hyb_1/config.json", hf_base);
    text = (char*)slurp_file(path, &n);
    CHECK(strstr(text, "\"layers\": [0],") && strstr(text, "\"num_kv_heads\": 4,") && strstr(text, "\"window_size\": null,") &&
          strstr(text, "\"rope_theta\": 10000.0\n"), "kda hybrid config.json's attn spec is wrong:\n%s", text);
    free(text);
    // fla's accepted forms: a list of specs, absent num_kv_heads / window_size / rope_theta (fla's defaults)
    const char* list = "{\"model_type\": \"kda\", \"hidden_size\": 64, \"num_hidden_layers\": 3, \"attn\": [{\"layers\": [2], "
                       "\"num_heads\": 4}, {\"layers\": [0], \"num_heads\": 4, \"num_kv_heads\": 4, \"window_size\": null}]}";
    int cls;
    err = hf_read_config(list, strlen(list), &c2, &cls);
    CHECK(!err && c2.attn_layers.w[0] == 5 && c2.attn_heads == 4 && c2.attn_kv_heads == 4 && c2.attn_window == 0 &&
          c2.rope_theta == 10000.0f, "attn as a list of two specs: %s", err ? err : "wrong fields");
    struct { const char* attn; const char* reason; } bad[] = {
        {"{\"layers\": [3], \"num_heads\": 4}", "layers must be integers in [0, num_hidden_layers = 3)"},
        {"[{\"layers\": [1], \"num_heads\": 4}, {\"layers\": [1], \"num_heads\": 4}]", "names layer 1 twice"},
        {"[{\"layers\": [1], \"num_heads\": 4}, {\"layers\": [2], \"num_heads\": 8}]", "one setting for all"},
        {"{\"layers\": [1], \"num_heads\": 4, \"num_kv_heads\": 3}", "must divide"},
        {"{\"layers\": [1], \"num_heads\": 4, \"window_size\": 0}", "window_size must be null or a positive"},
        {"{\"layers\": [1]}", "needs \"layers\" (a list) and \"num_heads\""},
        {"5", "must be null, an object or a list"},
    };
    int refused = 0;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char js[400];
        snprintf(js, sizeof js, "{\"model_type\": \"kda\", \"hidden_size\": 64, \"num_hidden_layers\": 3, \"attn\": %s}", bad[i].attn);
        err = hf_read_config(js, strlen(js), &c2, &cls);
        CHECK(err && strstr(err, bad[i].reason), "attn %s: %s (want '%s')", bad[i].attn, err ? err : "accepted", bad[i].reason);
        refused += err != NULL;
    }
    printf("  hybrids: export -> import bit-exact (%d of 2: pgdn with GQA + window, kda with attention first); fla's "
           "Attention keys and shapes, the \"attn\" spec in config.json; a list of specs read; %d bad specs refused\n",
           same, refused);
}

// ---- the command line: files refused by --import-hf (exit 2 and the reason), tokenizer files, -e after import

// copies the export in `src` to dst, with `key` of model.safetensors written with another shape or dtype, or dropped
static void hf_tamper(const char* src, const char* dst, const char* key, const char* how) {
    char cmd[600], path[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s && cp -r %s %s", dst, src, dst);
    CHECK(system(cmd) == 0, "cannot copy %s", src);
    snprintf(path, sizeof path, "%s/model.safetensors", src);
    StFile st;
    if (st_open(&st, path)) { return; }
    StOut* so = (StOut*)callocCheck((size_t)st.n + 1, sizeof(StOut));
    float** bufs = (float**)callocCheck((size_t)st.n + 1, sizeof(float*));
    int n = 0;
    for (int i = 0; i < st.n; i++) {
        const StEntry* e = &st.e[i];
        size_t numel = 1;
        for (int k = 0; k < e->ndim; k++) { numel *= (size_t)e->shape[k]; }
        bufs[i] = (float*)mallocCheck((numel + 1) * sizeof(float));
        st_read(&st, e->name, e->ndim, e->shape, bufs[i]);
        if (strcmp(e->name, key) == 0 && strcmp(how, "drop") == 0) { continue; }
        StOut* o = &so[n++];
        o->name = e->name; o->ndim = e->ndim; o->data = bufs[i];
        for (int k = 0; k < e->ndim; k++) { o->shape[k] = e->shape[k]; }
        if (strcmp(e->name, key) == 0 && strcmp(how, "shape") == 0) { o->shape[0] -= 1; }   // fewer rows: fewer bytes
    }
    if (strcmp(how, "extra") == 0) { so[n++] = (StOut){"model.layers.0.attn.q_conv1d.bias", 1, {24}, NULL, 0}; }
    snprintf(path, sizeof path, "%s/model.safetensors", dst);
    st_write(path, so, n, 0);
    for (int i = 0; i < st.n; i++) { free(bufs[i]); }
    free(bufs); free(so);
    st_close(&st);
}

static void test_hf_cli(void) {
    char cmd[2048], dir[128];
    // a small gdn run, exported through the command line; the import continues training with -e
    snprintf(cmd, sizeof cmd, "./train_pdn --preset gdn-tiny --tie 0 -b 4 -t 32 --mqar-pairs 4 -x 3 -v 0 -o %s/run > /dev/null && "
             "./train_pdn -e %s/run/model_00000003.bin --export-hf %s/cli && ./train_pdn --import-hf %s/cli -o %s/imp",
             hf_base, hf_base, hf_base, hf_base, hf_base);
    int rc = run_cmd(cmd, outbuf, sizeof outbuf);
    CHECK(rc == 0 && strstr(outbuf, "as gated_deltanet (GatedDeltaNetForCausalLM)") && strstr(outbuf, "continue training with"),
          "--export-hf / --import-hf: rc %d\n%s", rc, outbuf);
    PdnConfig ca, cb;
    PdnLayout la_, lb_;
    real *pa = NULL, *pb = NULL;
    char p1[200], p2[200];
    snprintf(p1, sizeof p1, "%s/run/model_00000003.bin", hf_base);
    snprintf(p2, sizeof p2, "%s/imp/model_00000000.bin", hf_base);
    if (rc == 0) {
        pdn_checkpoint_read(p1, &ca, &la_, &pa, NULL);
        pdn_checkpoint_read(p2, &cb, &lb_, &pb, NULL);
        CHECK(hf_same_config(&ca, &cb) && memcmp(pa, pb, la_.num_elems * sizeof(real)) == 0,
              "the imported checkpoint differs from the exported one");
        free(pa); free(pb);
    }
    // -e from the import and -e from the original give the same first losses (the same parameters, bit for bit)
    char l1[256] = "", l2[256] = "";
    for (int k = 0; k < 2; k++) {
        snprintf(cmd, sizeof cmd, "./train_pdn -e %s -b 4 -t 32 --mqar-pairs 4 -x 2 -v 0 -o %s/cont%d", k ? p2 : p1, hf_base, k);
        rc = run_cmd(cmd, outbuf, sizeof outbuf);
        char* s = strstr(outbuf, "step     2/2 | loss ");
        CHECK(rc == 0 && s, "-e after --import-hf: rc %d\n%s", rc, outbuf);
        if (s) { snprintf(k ? l2 : l1, 256, "%.28s", s); }
    }
    CHECK(l1[0] && strcmp(l1, l2) == 0, "training from the import differs from training from the original: '%s' vs '%s'", l1, l2);
    // refusals through the command line: exit 2 and the reason
    snprintf(dir, sizeof dir, "%s/cli", hf_base);
    struct { const char* key; const char* how; const char* reason; } bad[] = {
        {"model.layers.1.attn.A_log", "drop", "is missing"},
        {"model.layers.0.attn.q_proj.weight", "shape", "has shape [63, 64], the config needs [64, 64]"},
        {"", "extra", "is not part of"},
    };
    int refused = 0;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char dst[160];
        snprintf(dst, sizeof dst, "%s/bad%zu", hf_base, i);
        hf_tamper(dir, dst, bad[i].key, bad[i].how);
        snprintf(cmd, sizeof cmd, "./train_pdn --import-hf %s -o %s/out", dst, dst);
        rc = run_cmd(cmd, outbuf, sizeof outbuf);
        CHECK(rc == EXIT_BADFILE && strstr(outbuf, bad[i].reason), "import of a file with %s %s: rc %d\n%s", bad[i].key,
              bad[i].how, rc, outbuf);
        refused += rc == EXIT_BADFILE;
    }
    // a truncated model.safetensors, and a config.json pdn.c cannot represent
    snprintf(cmd, sizeof cmd, "rm -rf %s/trunc && cp -r %s %s/trunc && truncate -s -100 %s/trunc/model.safetensors && "
             "./train_pdn --import-hf %s/trunc -o %s/trunc/out", hf_base, dir, hf_base, hf_base, hf_base, hf_base);
    rc = run_cmd(cmd, outbuf, sizeof outbuf);
    CHECK(rc == EXIT_BADFILE && strstr(outbuf, "past the end"), "truncated safetensors: rc %d\n%s", rc, outbuf);
    refused += rc == EXIT_BADFILE;
    snprintf(cmd, sizeof cmd, "rm -rf %s/gate && cp -r %s %s/gate && sed -i 's/\"use_gate\": false/\"use_gate\": true/' "
             "%s/gate/config.json && ./train_pdn --import-hf %s/gate -o %s/gate/out", hf_base, dir, hf_base, hf_base, hf_base, hf_base);
    rc = run_cmd(cmd, outbuf, sizeof outbuf);
    CHECK(rc == EXIT_BADFILE && strstr(outbuf, "use_gate true"), "use_gate true: rc %d\n%s", rc, outbuf);
    refused += rc == EXIT_BADFILE;
    // flag errors: exit 1
    snprintf(cmd, sizeof cmd, "./train_pdn --export-hf %s/x", hf_base);
    rc = run_cmd(cmd, outbuf, sizeof outbuf);
    CHECK(rc == EXIT_USAGE && strstr(outbuf, "needs -e"), "--export-hf without -e: rc %d", rc);
    snprintf(cmd, sizeof cmd, "./train_pdn --import-hf %s", dir);
    rc = run_cmd(cmd, outbuf, sizeof outbuf);
    CHECK(rc == EXIT_USAGE && strstr(outbuf, "needs -o"), "--import-hf without -o: rc %d", rc);
    snprintf(cmd, sizeof cmd, "./train_pdn -e %s --export-hf %s/x --export-dtype fp16", p1, hf_base);
    rc = run_cmd(cmd, outbuf, sizeof outbuf);
    CHECK(rc == EXIT_USAGE && strstr(outbuf, "fp32 or bf16"), "--export-dtype fp16: rc %d", rc);
    printf("  command line: --export-hf -> --import-hf gives the same checkpoint, -e from it trains exactly as from the "
           "original; %d damaged directories refused (exit 2 with the reason); 3 flag errors exit 1\n", refused);
}

// the tokenizer files: a vocabulary trained by dev/data/train_bpe, and GPT-2's when ../shared has it
static void hf_check_tokenizer(const Tokenizer* tok, const char* dir, const char* what) {
    char p1[200], p2[200];
    snprintf(p1, sizeof p1, "%s/vocab.json", dir);
    snprintf(p2, sizeof p2, "%s/merges.txt", dir);
    Tokenizer back;
    tokenizer_load_gpt2(&back, p1, p2);
    int same = back.vocab_size == tok->vocab_size && back.n_merges == tok->n_merges && back.eot_id == tok->eot_id;
    for (int i = 0; same && i < tok->vocab_size; i++) {
        size_t la, lb;
        const uint8_t *a = tokenizer_token(tok, i, &la), *b = tokenizer_token(&back, i, &lb);
        same = la == lb && memcmp(a, b, la) == 0;
    }
    for (int r = 0; same && r < tok->n_merges; r++) { same = back.merge_left[r] == tok->merge_left[r] && back.merge_right[r] == tok->merge_right[r]; }
    CHECK(same, "%s: vocab.json + merges.txt do not reload as the same vocabulary", what);
    tokenizer_free(&back);
    snprintf(p1, sizeof p1, "%s/tokenizer_config.json", dir);
    size_t n;
    char* text = (char*)slurp_file(p1, &n);
    JDoc d;
    const char* err = jdoc_parse(&d, text, n);
    int cls = err ? -1 : j_get(&d, 0, "tokenizer_class"), eos = err ? -1 : j_get(&d, 0, "eos_token");
    CHECK(!err && cls >= 0 && d.v[cls].type == J_STR && strcmp(d.v[cls].str, "GPT2Tokenizer") == 0 && eos >= 0 &&
          d.v[eos].type == J_STR && strcmp(d.v[eos].str, "<|endoftext|>") == 0,
          "%s: tokenizer_config.json does not name GPT2Tokenizer with <|endoftext|> (%s)", what, err ? err : "");
    if (!err) { jdoc_free(&d); }
    free(text);
    snprintf(p1, sizeof p1, "%s/config.json", dir);
    text = (char*)slurp_file(p1, &n);
    char want[64];
    snprintf(want, sizeof want, "\"eos_token_id\": %d", tok->eot_id);
    CHECK(strstr(text, want) != NULL, "%s: config.json lacks %s", what, want);
    free(text);
}

static void test_hf_tokenizer(void) {
    char cmd[1024], corpus[160], tokdir[160];
    snprintf(corpus, sizeof corpus, "%s/corpus.txt", hf_base);
    snprintf(tokdir, sizeof tokdir, "%s/tok", hf_base);
    FILE* f = fopenCheck(corpus, "wb");
    for (int i = 0; i < 50; i++) { fprintf(f, "The quick brown fox %d jumps over the lazy dog; naïve café, 東京 %d.\n", i, i * 7); }
    fclose(f);
    snprintf(cmd, sizeof cmd, "./dev/data/train_bpe --vocab-size 300 --quiet 1 --out-dir %s %s", tokdir, corpus);
    int rc = run_cmd(cmd, outbuf, sizeof outbuf);
    CHECK(rc == 0, "train_bpe failed: %s", outbuf);
    if (rc) { return; }
    Tokenizer tok;
    snprintf(cmd, sizeof cmd, "%s/tokenizer.bin", tokdir);
    tokenizer_load(&tok, cmd);
    // the model's vocabulary is padded past the tokenizer's: only the tokenizer's rows are exported
    PdnConfig c = hf_config("pgdn", 0);
    c.vocab_size = tok.vocab_size + 20;
    PdnLayout lay;
    float* p = hf_params(&c, &lay, 11);
    char dir[160];
    snprintf(dir, sizeof dir, "%s/tokexp", hf_base);
    int cls, rows, ign;
    hf_export(dir, &c, p, 0, &tok, &cls, &rows);
    hf_check_tokenizer(&tok, dir, "train_bpe vocabulary");
    Tokenizer fromdir;   // --tokenizer DIR reads an export's vocab.json + merges.txt
    tokenizer_load(&fromdir, dir);
    CHECK(fromdir.vocab_size == tok.vocab_size && fromdir.n_merges == tok.n_merges, "tokenizer_load(export dir) differs");
    tokenizer_free(&fromdir);
    PdnConfig c2;
    float* q;
    hf_import(dir, &c2, &q, &ign);
    PdnLayout lay2;
    pdn_build_layout(&c2, &lay2);
    size_t d = (size_t)c.d_model, nrow = (size_t)tok.vocab_size;
    int rows_ok = c2.vocab_size == tok.vocab_size &&
                  memcmp(PDN_PARAM(q, &lay2, T_WTE, 0), PDN_PARAM(p, &lay, T_WTE, 0), nrow * d * sizeof(float)) == 0 &&
                  memcmp(PDN_PARAM(q, &lay2, T_LM_HEAD, 0), PDN_PARAM(p, &lay, T_LM_HEAD, 0), nrow * d * sizeof(float)) == 0;
    CHECK(rows_ok, "padded vocabulary: import has vocab %d (want %d) or other rows", c2.vocab_size, tok.vocab_size);
    free(p); free(q);
    tokenizer_free(&tok);
    int gpt2 = 0;
    char ej[300], vb[300];
    snprintf(ej, sizeof ej, "%s/data/gpt2/encoder.json", shared_dir());
    snprintf(vb, sizeof vb, "%s/data/gpt2/vocab.bpe", shared_dir());
    if (file_exists(ej) && file_exists(vb)) {
        tokenizer_load_gpt2(&tok, ej, vb);
        PdnConfig g = hf_config("kda", 1);
        g.vocab_size = 50304; g.d_model = 8; g.n_head = 1; g.head_k = 8; g.expand_v = 1; g.mlp_hidden = 8; g.n_layer = 1;
        p = hf_params(&g, &lay, 5);
        snprintf(dir, sizeof dir, "%s/gpt2exp", hf_base);
        hf_export(dir, &g, p, 1, &tok, &cls, &rows);
        hf_check_tokenizer(&tok, dir, "GPT-2");
        char a[200], b[200];
        snprintf(a, sizeof a, "%s/vocab.json", dir);
        snprintf(b, sizeof b, "%s/merges.txt", dir);
        CHECK(files_equal(a, ej) && files_equal(b, vb), "GPT-2: vocab.json / merges.txt differ from the published files");
        size_t n;
        snprintf(a, sizeof a, "%s/config.json", dir);
        char* text = (char*)slurp_file(a, &n);
        CHECK(strstr(text, "\"vocab_size\": 50257") && strstr(text, "\"bos_token_id\": 50256"), "GPT-2 export: vocab/bos wrong");
        free(text); free(p);
        tokenizer_free(&tok);
        gpt2 = 1;
    }
    printf("  tokenizer files: a train_bpe vocabulary%s reloads from vocab.json + merges.txt as the same vocabulary, "
           "tokenizer_config.json names GPT2Tokenizer, --tokenizer reads the export directory; padding rows dropped%s\n",
           gpt2 ? " and GPT-2's (byte-identical to the published files)" : "",
           gpt2 ? "" : " (GPT-2's vocabulary skipped: no ../shared/data/gpt2)");
}

static void run_hf_tests(void) {
    printf("Hugging Face / fla export and import (hf.h):\n");
    snprintf(hf_base, sizeof hf_base, "/tmp/pdn_hf_XXXXXX");
    if (!mkdtemp(hf_base)) { n_fail++; printf("FAIL: cannot make a temporary directory\n"); return; }
    test_hf_roundtrip();
    test_hf_bf16();
    test_safetensors_format();
    test_hf_keys();
    test_hf_config();
    test_hf_hybrid();
    test_hf_cli();
    test_hf_tokenizer();
    if (!n_fail) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", hf_base);
        if (system(cmd) != 0) { printf("  (could not remove %s)\n", hf_base); }
    }
}
