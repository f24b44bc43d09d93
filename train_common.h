/*
train_common.h: host code shared by train_pdn.c and train_pdn.cu, so both trainers have one command line.
defines: TrainConfig and its flag table TRAIN_FIELDS, parse_args() (presets, model and training flags),
usage, the boxed configuration printout, the learning-rate schedule, the training-state file (optimizer
moments, step, data position), resume discovery and the log file.
*/
#ifndef PDN_TRAIN_COMMON_H
#define PDN_TRAIN_COMMON_H

#include <dirent.h>
#include "pdn.h"
#include "mqar.h"

// X(type, field, short flag, long flag, default, help). type: I int, L long, F float, S string.
#define TRAIN_FIELDS(X) \
    X(I, mqar_vocab,    NULL, "--mqar-vocab",   "64",   "MQAR vocabulary (keys < vocab/2 <= values)") \
    X(I, mqar_pairs,    NULL, "--mqar-pairs",   "8",    "MQAR key-value pairs per sequence") \
    X(F, mqar_power_a,  NULL, "--mqar-power-a", "0.01", "MQAR query placement power law") \
    X(I, B,             "-b", "--batch",        "16",   "micro-batch size (sequences)") \
    X(I, T,             "-t", "--seq-len",      "64",   "sequence length (MQAR: the example length)") \
    X(L, total_batch,   "-d", "--total-batch",  "0",    "tokens per optimizer step (0: B*T); must be a multiple of B*T") \
    X(I, steps,         "-x", "--steps",        "1500",  "optimizer steps") \
    X(F, lr,            "-l", "--lr",           "5e-3", "peak learning rate") \
    X(I, warmup,        "-u", "--warmup",       "50",   "linear warm-up steps") \
    X(F, final_lr_frac, "-q", "--final-lr-frac","0.1",  "final lr as a fraction of the peak (cosine)") \
    X(F, weight_decay,  "-c", "--weight-decay", "0.1",  "AdamW weight decay (projection matrices and embeddings)") \
    X(F, beta1,         NULL, "--beta1",        "0.9",  "AdamW beta1") \
    X(F, beta2,         NULL, "--beta2",        "0.95", "AdamW beta2") \
    X(F, adam_eps,      NULL, "--adam-eps",     "1e-8", "AdamW epsilon") \
    X(F, grad_clip,     NULL, "--grad-clip",    "1.0",  "clip the global gradient norm to this (0: off)") \
    X(L, seed,          NULL, "--seed",         "1337", "seed for init, data and sampling") \
    X(S, mixer,         NULL, "--mixer",        "chunk","mixer form: chunk (SPEC §4) | token (SPEC §3)") \
    X(I, chunk,         NULL, "--chunk",        "64",   "chunk size of the chunkwise mixer") \
    X(I, val_every,     "-v", "--val-every",    "250",  "evaluate held-out loss/accuracy every N steps (0: only at the end)") \
    X(I, val_batches,   "-m", "--val-batches",  "8",    "held-out batches per evaluation") \
    X(I, gen_tokens,    "-g", "--gen-tokens",   "64",   "tokens to generate (samples and --generate)") \
    X(S, out_dir,       "-o", "--out-dir",      "",     "output directory: log, checkpoints, state") \
    X(I, ckpt_every,    "-n", "--ckpt-every",   "0",    "checkpoint every N steps (0: only at the end, if -o)") \
    X(I, resume,        "-y", "--resume",       "0",    "1: resume from the latest checkpoint in -o") \
    X(S, init_ckpt,     "-e", "--init",         "",     "start from this checkpoint (its config wins)") \
    X(I, generate,      NULL, "--generate",     "0",    "with -e: generate N tokens from --prompt and exit") \
    X(S, prompt,        NULL, "--prompt",       "",     "generation prompt: token ids separated by spaces/commas") \
    X(F, temperature,   NULL, "--temperature",  "1.0",  "sampling temperature (0: greedy)") \
    X(I, top_k,         NULL, "--top-k",        "0",    "sample from the k most likely tokens (0: all)") \
    X(I, threads,       NULL, "--threads",      "0",    "OpenMP threads (0: all cores)") \
    X(S, debug_state,   NULL, "--debug-state",  "",     "write one step's inputs, logits, loss and grads to FILE and exit")

#define TRAIN_CTYPE_I int
#define TRAIN_CTYPE_L long
#define TRAIN_CTYPE_F float
#define TRAIN_CTYPE_S char*
#define TRAIN_DECLARE(type, field, s, l, def, help) TRAIN_CTYPE_##type field;
typedef struct {
    TRAIN_FIELDS(TRAIN_DECLARE)
    char preset[64];
    int count_params;   // --count-params: print the parameter count and exit
    int grad_accum;     // derived: total_batch / (B*T)
    int chunk_form;     // derived: 1 = chunkwise mixer, 0 = per-token
} TrainConfig;

typedef struct { char type; const char *name, *sflag, *lflag, *def, *help; size_t offset; } TrainField;
#define TRAIN_ENTRY(type, field, s, l, def, help) {#type[0], #field, s, l, def, help, offsetof(TrainConfig, field)},
static const TrainField TRAIN_FIELDS_TABLE[] = { TRAIN_FIELDS(TRAIN_ENTRY) };
#define TRAIN_NUM_FIELDS ((int)(sizeof(TRAIN_FIELDS_TABLE) / sizeof(TRAIN_FIELDS_TABLE[0])))

static int train_field_set(TrainConfig* tc, const TrainField* f, const char* val) {
    void* p = (char*)tc + f->offset;
    char* end = NULL;
    if (f->type == 'S') { *(const char**)p = val; return 0; }
    if (f->type == 'F') {
        float v = strtof(val, &end);
        if (end == val || *end || !isfinite(v)) { return -1; }
        *(float*)p = v;
        return 0;
    }
    long long v = strtoll(val, &end, 10);
    if (end == val || *end) { return -1; }
    if (f->type == 'I') {
        if (v < -1000000000LL || v > 1000000000LL) { return -1; }
        *(int*)p = (int)v;
    } else {
        *(long*)p = (long)v;
    }
    return 0;
}

static void train_defaults(TrainConfig* tc) {
    memset(tc, 0, sizeof(*tc));
    for (int i = 0; i < TRAIN_NUM_FIELDS; i++) { train_field_set(tc, &TRAIN_FIELDS_TABLE[i], TRAIN_FIELDS_TABLE[i].def); }
    strcpy(tc->preset, "pgdn-tiny");
}

// The paper's training recipe (SPEC §7), applied with the paper-size presets (340m, 1b); flags still win.
static void train_apply_paper_recipe(TrainConfig* tc) {
    tc->T = 2048; tc->total_batch = 524288; tc->steps = 30000; tc->lr = 4e-4f; tc->warmup = 1024;
    tc->final_lr_frac = 0.1f; tc->weight_decay = 0.01f; tc->beta1 = 0.9f; tc->beta2 = 0.95f; tc->adam_eps = 1e-8f;
    tc->grad_clip = 1.0f;
}

static void print_usage(const char* prog) {
    printf("usage: %s [flags]   (every flag takes a value, except --count-params and --help)\n\n", prog);
    printf("model:\n  %-28s %s\n  %-28s %s\n", "--preset NAME", "variant-size preset (default pgdn-tiny)",
           "--variant NAME", "dn | pdn | gdn | pgdn | kda | pkda (sets --decay, --precond, --out-gate)");
    for (int i = 0; i < PDN_NUM_FIELDS; i++) { printf("  %-28s %s\n", PDN_FIELDS[i].flag, PDN_FIELDS[i].help); }
    printf("\ntraining:\n");
    for (int i = 0; i < TRAIN_NUM_FIELDS; i++) {
        const TrainField* f = &TRAIN_FIELDS_TABLE[i];
        char fl[48];
        snprintf(fl, sizeof fl, "%s%s%s", f->sflag ? f->sflag : "", f->sflag ? ", " : "", f->lflag);
        printf("  %-28s %s (default %s)\n", fl, f->help, f->def[0] ? f->def : "none");
    }
    printf("  %-28s %s\n\n", "--count-params", "print the parameter count (last line) and exit");
    pdn_list_presets(stdout);
}

// Parse argv. The preset is applied first, then --variant, then every other flag, whatever their order.
// Model fields left at 0 that a preset does not set (vocab for tiny presets) are filled by the caller.
static void parse_args(int argc, char** argv, PdnConfig* mc, TrainConfig* tc) {
    pdn_config_defaults(mc);
    train_defaults(tc);
    const char* variant = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) { print_usage(argv[0]); exit(0); }
        if (strcmp(argv[i], "--count-params") == 0) { tc->count_params = 1; continue; }
        if (argv[i][0] != '-') { fail(EXIT_USAGE, "unexpected argument '%s' (flags come as '-x value' pairs; see --help)", argv[i]); }
        if (i + 1 >= argc) { fail(EXIT_USAGE, "flag %s needs a value (see --help)", argv[i]); }
        if (strcmp(argv[i], "--preset") == 0) {
            if (strlen(argv[i + 1]) >= sizeof(tc->preset)) { fail(EXIT_USAGE, "preset name too long"); }
            strcpy(tc->preset, argv[i + 1]);
        }
        if (strcmp(argv[i], "--variant") == 0) { variant = argv[i + 1]; }
        i++;
    }
    PdnConfig probe = *mc;
    const PdnSize* sz = pdn_preset_apply(&probe, tc->preset);
    if (!sz) {
        fprintf(stderr, "error: unknown preset '%s'\n", tc->preset);
        pdn_list_presets(stderr);
        exit(EXIT_USAGE);
    }
    *mc = probe;
    if (sz->paper) { train_apply_paper_recipe(tc); }
    if (variant && pdn_variant_apply(mc, variant) != 0) {
        fail(EXIT_USAGE, "unknown --variant '%s' (dn | pdn | gdn | pgdn | kda | pkda)", variant);
    }
    for (int i = 1; i < argc; i++) {
        const char* a = argv[i];
        if (strcmp(a, "--count-params") == 0) { continue; }
        const char* val = argv[++i];
        if (strcmp(a, "--preset") == 0 || strcmp(a, "--variant") == 0) { continue; }
        int done = 0;
        for (int k = 0; k < PDN_NUM_FIELDS && !done; k++) {
            if (strcmp(a, PDN_FIELDS[k].flag) != 0) { continue; }
            if (pdn_field_set(mc, &PDN_FIELDS[k], val) != 0) {
                fail(EXIT_USAGE, "bad value '%s' for %s (%s)", val, a, PDN_FIELDS[k].help);
            }
            done = 1;
        }
        for (int k = 0; k < TRAIN_NUM_FIELDS && !done; k++) {
            const TrainField* f = &TRAIN_FIELDS_TABLE[k];
            if (!((f->sflag && strcmp(a, f->sflag) == 0) || strcmp(a, f->lflag) == 0)) { continue; }
            if (train_field_set(tc, f, val) != 0) { fail(EXIT_USAGE, "bad value '%s' for %s (%s)", val, a, f->help); }
            done = 1;
        }
        if (strcmp(a, "--mqar-len") == 0) { // alias: the MQAR example length is the sequence length
            if (sscanf(val, "%d", &tc->T) != 1) { fail(EXIT_USAGE, "bad value '%s' for %s", val, a); }
            done = 1;
        }
        if (!done) { fail(EXIT_USAGE, "unknown flag '%s' (see --help)", a); }
    }
}

// Check the training settings that do not depend on the model; derive grad_accum and the mixer form.
// nproc: number of data-parallel processes (1 on the CPU).
static void train_config_check(TrainConfig* tc, int nproc) {
    if (tc->B < 1) { fail(EXIT_USAGE, "-b (micro-batch) must be >= 1, got %d", tc->B); }
    if (tc->T < 1) { fail(EXIT_USAGE, "-t (sequence length) must be >= 1, got %d", tc->T); }
    long tok_per_micro = (long)tc->B * tc->T * nproc;
    if (tc->total_batch == 0) { tc->total_batch = tok_per_micro; }
    if (tc->total_batch < 0 || tc->total_batch % tok_per_micro != 0) {
        long lo = (tc->total_batch / tok_per_micro) * tok_per_micro;
        fail(EXIT_USAGE, "-d %ld (tokens per step) is not a positive multiple of -b %d x -t %d%s = %ld tokens per micro-step\n"
             "  hint: use -d %ld or %ld", tc->total_batch, tc->B, tc->T, nproc > 1 ? " x processes" : "", tok_per_micro,
             lo > 0 ? lo : tok_per_micro, lo > 0 ? lo + tok_per_micro : 2 * tok_per_micro);
    }
    tc->grad_accum = (int)(tc->total_batch / tok_per_micro);
    if (tc->steps < 0) { fail(EXIT_USAGE, "-x (steps) must be >= 0"); }
    if (!(tc->lr >= 0) || tc->warmup < 0 || !(tc->final_lr_frac >= 0 && tc->final_lr_frac <= 1)) {
        fail(EXIT_USAGE, "need -l >= 0, -u >= 0 and 0 <= -q <= 1");
    }
    if (!(tc->beta1 >= 0 && tc->beta1 < 1 && tc->beta2 >= 0 && tc->beta2 < 1 && tc->adam_eps > 0 && tc->weight_decay >= 0)) {
        fail(EXIT_USAGE, "need 0 <= --beta1, --beta2 < 1, --adam-eps > 0, -c >= 0");
    }
    if (strcmp(tc->mixer, "chunk") == 0) { tc->chunk_form = 1; }
    else if (strcmp(tc->mixer, "token") == 0) { tc->chunk_form = 0; }
    else { fail(EXIT_USAGE, "--mixer must be chunk or token, got '%s'", tc->mixer); }
    if (tc->chunk < 1 || tc->chunk > 1024) { fail(EXIT_USAGE, "--chunk must be in 1..1024"); }
    if (tc->val_every < 0 || tc->val_batches < 0 || tc->ckpt_every < 0 || tc->gen_tokens < 0 || tc->generate < 0) {
        fail(EXIT_USAGE, "-v, -m, -n, -g and --generate must be >= 0");
    }
    if (tc->resume && !tc->out_dir[0]) { fail(EXIT_USAGE, "-y 1 (resume) needs -o DIR, the directory holding the checkpoints"); }
    if (tc->resume && tc->init_ckpt[0]) { fail(EXIT_USAGE, "use either -y 1 (resume from -o) or -e FILE (init), not both"); }
    if (tc->generate && !tc->init_ckpt[0]) { fail(EXIT_USAGE, "--generate needs -e CHECKPOINT"); }
    if (!(tc->temperature >= 0) || tc->top_k < 0) { fail(EXIT_USAGE, "need --temperature >= 0 and --top-k >= 0"); }
}

// ----------------------------------------------------------------------------------------------------
// learning rate: linear warm-up to lr over `warmup` steps, then cosine down to lr * final_lr_frac at the last step

static float lr_at(const TrainConfig* tc, int step) {
    if (step < tc->warmup) { return tc->lr * (float)(step + 1) / (float)tc->warmup; }
    int span = tc->steps - tc->warmup;
    float frac = span <= 1 ? 1.0f : (float)(step - tc->warmup) / (float)(span - 1);
    if (frac > 1) { frac = 1; }
    float cosine = 0.5f * (1.0f + cosf(3.14159265358979f * frac));
    float lo = tc->lr * tc->final_lr_frac;
    return lo + (tc->lr - lo) * cosine;
}

// ----------------------------------------------------------------------------------------------------
// the boxed configuration printout

static void box_line(const char* key, const char* val) { printf("| %-26s | %-45s |\n", key, val); }
static void box_rule(void) { printf("+----------------------------+-----------------------------------------------+\n"); }

static void print_config_box(const PdnConfig* mc, const TrainConfig* tc, const PdnLayout* lay, const char* device,
                             const char* precision) {
    char v[96];
    box_rule();
    box_line("Parameter", "Value");
    box_rule();
    box_line("device", device);
    box_line("precision", precision);
    box_line("preset", tc->preset);
    pdn_variant_name(mc, v, sizeof v);
    box_line("variant", v);
    for (int i = 0; i < PDN_NUM_FIELDS; i++) {
        pdn_field_str(mc, &PDN_FIELDS[i], v, sizeof v);
        box_line(PDN_FIELDS[i].name, v);
    }
    snprintf(v, sizeof v, "%zu (%.2f M)", lay->num_params, lay->num_params / 1e6);
    box_line("parameters", v);
    box_rule();
    for (int i = 0; i < TRAIN_NUM_FIELDS; i++) {
        const TrainField* f = &TRAIN_FIELDS_TABLE[i];
        const void* p = (const char*)tc + f->offset;
        if (f->type == 'S') { snprintf(v, sizeof v, "%s", (*(char* const*)p)[0] ? *(char* const*)p : "-"); }
        else if (f->type == 'F') { snprintf(v, sizeof v, "%g", *(const float*)p); }
        else if (f->type == 'I') { snprintf(v, sizeof v, "%d", *(const int*)p); }
        else { snprintf(v, sizeof v, "%ld", *(const long*)p); }
        box_line(f->name, v);
    }
    snprintf(v, sizeof v, "%d", tc->grad_accum);
    box_line("grad_accum (derived)", v);
    box_rule();
}

// ----------------------------------------------------------------------------------------------------
// the training-state file: what -y 1 needs besides the parameters. Same text-header scheme as the checkpoint:
//
//   PDNSTATE / version 1 / header_bytes / dtype (of m and v) / num_elems / step / model_crc (CRC of the
//   checkpoint file written with it: the pair must match) / batch, seq_len, grad_accum, nproc (must match on
//   resume for the data order to continue exactly) / data_state (up to 16 u64 of the data source's position)
//   crc32 / end, then m[num_elems], v[num_elems]

#define DATA_STATE_MAX 16
typedef struct {
    long step;
    uint32_t model_crc;
    int B, T, grad_accum, nproc;
    int n_data;
    uint64_t data[DATA_STATE_MAX];
} TrainState;

static void state_write(const char* path, const TrainState* s, const void* m, const void* v, size_t num_elems, const char* dtype) {
    TextBuf tb = {0};
    tb_printf(&tb, "%s\nversion %d\nheader_bytes 0000000000\ndtype %s\nnum_elems %zu\nstep %ld\nmodel_crc %08x\n"
              "batch %d\nseq_len %d\ngrad_accum %d\nnproc %d\ndata_state %d", PDN_STATE_MAGIC, PDN_CKPT_VERSION, dtype,
              num_elems, s->step, s->model_crc, s->B, s->T, s->grad_accum, s->nproc, s->n_data);
    for (int i = 0; i < s->n_data; i++) { tb_printf(&tb, " %016llx", (unsigned long long)s->data[i]); }
    tb_printf(&tb, "\n");
    const void* bufs[2] = {m, v};
    size_t nb[2] = {num_elems * dtype_size(dtype), num_elems * dtype_size(dtype)};
    write_headed_file(path, &tb, bufs, nb, 2);
    free(tb.s);
}

// Reads a state file written for a buffer of num_elems elements of `dtype` into m and v (caller-allocated).
static void state_read(const char* path, TrainState* s, void* m, void* v, size_t num_elems, const char* dtype) {
    FILE* f = fopenCheck(path, "rb");
    Header h;
    header_read(f, path, PDN_STATE_MAGIC, &h);
    char dt[16] = {0};
    header_get(&h, "dtype", dt, sizeof dt);
    if (strcmp(dt, dtype) != 0) { fail(EXIT_BADFILE, "%s: optimizer state is %s, this build keeps %s", path, dt, dtype); }
    if ((size_t)header_get_ll(&h, "num_elems", path) != num_elems) {
        fail(EXIT_BADFILE, "%s: optimizer state for a different model size (%lld elements, model has %zu)", path,
             header_get_ll(&h, "num_elems", path), num_elems);
    }
    memset(s, 0, sizeof(*s));
    s->step = (long)header_get_ll(&h, "step", path);
    s->B = (int)header_get_ll(&h, "batch", path);
    s->T = (int)header_get_ll(&h, "seq_len", path);
    s->grad_accum = (int)header_get_ll(&h, "grad_accum", path);
    s->nproc = (int)header_get_ll(&h, "nproc", path);
    char val[512];
    if (!header_get(&h, "model_crc", val, sizeof val)) { fail(EXIT_BADFILE, "%s: no model_crc line", path); }
    s->model_crc = (uint32_t)strtoul(val, NULL, 16);
    if (!header_get(&h, "data_state", val, sizeof val)) { fail(EXIT_BADFILE, "%s: no data_state line", path); }
    char* p = val;
    s->n_data = (int)strtol(p, &p, 10);
    if (s->n_data < 0 || s->n_data > DATA_STATE_MAX) { fail(EXIT_BADFILE, "%s: bad data_state", path); }
    for (int i = 0; i < s->n_data; i++) { s->data[i] = strtoull(p, &p, 16); }
    void* dsts[2] = {m, v};
    size_t nb[2] = {num_elems * dtype_size(dtype), num_elems * dtype_size(dtype)};
    headed_read_data(f, path, &h, dsts, nb, 2);
    fclose(f);
    free(h.text);
}

// checkpoint file names inside the output directory
static void ckpt_paths(const char* dir, long step, char* model, char* state, size_t n) {
    snprintf(model, n, "%s/model_%08ld.bin", dir, step);
    snprintf(state, n, "%s/state_%08ld.bin", dir, step);
}

// the latest step in dir for which both the model and the state file exist; -1 if none
static long find_latest_checkpoint(const char* dir) {
    DIR* d = opendir(dir);
    if (!d) { return -1; }
    long best = -1;
    struct dirent* e;
    while ((e = readdir(d)) != NULL) {
        long step;
        char tail[8];
        if (sscanf(e->d_name, "state_%ld.bi%1s", &step, tail) == 2 && strcmp(e->d_name + strlen(e->d_name) - 4, ".bin") == 0) {
            char mp[1100], sp[1100];
            ckpt_paths(dir, step, mp, sp, sizeof mp);
            if (file_exists(mp) && step > best) { best = step; }
        }
    }
    closedir(d);
    return best;
}

// ----------------------------------------------------------------------------------------------------
// log file: <out_dir>/main.log, one line per event, appended (a resumed run continues the same file)

typedef struct { char path[1100]; int active; } Logger;

static void logger_init(Logger* lg, const char* dir, int resuming) {
    lg->active = dir && dir[0];
    if (!lg->active) { return; }
    snprintf(lg->path, sizeof lg->path, "%s/main.log", dir);
    FILE* f = fopenCheck(lg->path, resuming ? "a" : "w");
    fclose(f);
}

static void logger_printf(Logger* lg, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static void logger_printf(Logger* lg, const char* fmt, ...) {
    if (!lg->active) { return; }
    FILE* f = fopenCheck(lg->path, "a");
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fclose(f);
}

static void format_eta(double seconds, char* out, size_t n) {
    if (seconds < 0) { seconds = 0; }
    long s = (long)(seconds + 0.5);
    if (s >= 3600) { snprintf(out, n, "%ldh%02ldm", s / 3600, (s / 60) % 60); }
    else { snprintf(out, n, "%ldm%02lds", s / 60, s % 60); }
}

#endif // PDN_TRAIN_COMMON_H
