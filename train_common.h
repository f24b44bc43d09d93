/*
train_common.h: host code shared by train_pdn.c and train_pdn.cu, so both trainers have one command line.
defines: TrainConfig and its flag table TRAIN_FIELDS, parse_args() (presets, model and training flags),
usage, the boxed configuration printout, the learning-rate schedule, the training-state file (optimizer
moments, step, data position), resume discovery, the log file, and the data source (MQAR or text shards: the
batches, the held-out batches, the saved position) with the tokenizer-side helpers (prompts, decoded samples).
Last, the run itself, written once for both trainers (--generate, resume, --debug-state, the training loop with
its schedule of evaluations, samples and checkpoints): each trainer provides the few tr_* calls that differ.
*/
#ifndef PDN_TRAIN_COMMON_H
#define PDN_TRAIN_COMMON_H

#include <dirent.h>
#include <limits.h>
#include <signal.h>
#include "pdn.h"
#include "mqar.h"
#include "tokenizer.h"
#include "dataloader.h"
#include "hf.h"

// X(type, field, short flag, long flag, default, help). type: I int, L long, F float, S string.
#define TRAIN_FIELDS(X) \
    X(S, train,         "-i", "--train",        "",     "text: training token shards, a glob ('dir/x_train_*.bin'); none: MQAR") \
    X(S, val,           "-j", "--val",          "",     "text: validation token shards, a glob (none: no val loss)") \
    X(S, tokenizer,     NULL, "--tokenizer",    "",     "dir of encoder.json + vocab.bpe, or a .bin: decodes samples, encodes --prompt") \
    X(I, sample_every,  "-s", "--sample-every", "0",    "text: a decoded sample of -g tokens every N steps (0: never)") \
    X(I, doc_mask,      NULL, "--doc-mask",     "0",    "text: 1 starts the recurrent state afresh at every document (after each end-of-text token)") \
    X(I, eot_id,        NULL, "--eot-id",       "-1",   "--doc-mask: the end-of-text token id (-1: the tokenizer's)") \
    X(I, mqar_vocab,    NULL, "--mqar-vocab",   "0",    "MQAR vocabulary, keys < vocab/2 <= values (0: 64 for pdn, 8192 for zoology)") \
    X(I, mqar_pairs,    NULL, "--mqar-pairs",   "8",    "MQAR key-value pairs per sequence") \
    X(F, mqar_power_a,  NULL, "--mqar-power-a", "0.01", "MQAR query placement power law") \
    X(S, mqar_gen,      NULL, "--mqar-gen",     "pdn",  "MQAR generator: pdn (fresh examples every step) | zoology (Zoology's fixed train/test sets)") \
    X(L, mqar_train,    NULL, "--mqar-train",   "100000", "zoology: training-set examples (served in one fixed order, epoch after epoch)") \
    X(L, mqar_test,     NULL, "--mqar-test",    "3000", "zoology: test-set examples (all of them at every evaluation)") \
    X(L, mqar_data_seed, NULL, "--mqar-data-seed", "123", "zoology: seed of the training and test sets (Zoology's DataConfig.seed)") \
    X(F, mqar_stop_acc, NULL, "--mqar-stop-acc", "0",   "MQAR: stop after an evaluation whose accuracy exceeds this fraction (Zoology: 0.99; 0: never)") \
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
    X(I, skip_nonfinite,NULL, "--skip-nonfinite","0",   "skip up to N steps in a row whose loss or gradient norm is not finite (0: stop at the first, exit 3)") \
    X(L, seed,          NULL, "--seed",         "1337", "seed for init, data and sampling") \
    X(S, mixer,         NULL, "--mixer",        "chunk","mixer form: chunk (MODEL.md §4) | token (MODEL.md §3)") \
    X(I, chunk,         NULL, "--chunk",        "64",   "chunk size of the chunkwise mixer") \
    X(I, recompute,     NULL, "--recompute",    "0",    "GPU trainer: 1 runs each layer's forward again in the backward (~1/3 more compute, one layer's activations)") \
    X(I, val_every,     "-v", "--val-every",    "250",  "evaluate held-out loss/accuracy every N steps (0: only at the end)") \
    X(I, val_batches,   "-m", "--val-batches",  "8",    "held-out batches per evaluation (text: the first N of -j; -1: all of it)") \
    X(I, gen_tokens,    "-g", "--gen-tokens",   "64",   "tokens per sample (-s)") \
    X(S, out_dir,       "-o", "--out-dir",      "",     "output directory: log, checkpoints, state") \
    X(I, ckpt_every,    "-n", "--ckpt-every",   "0",    "checkpoint every N steps (0: only at the end, if -o)") \
    X(I, keep_last,     NULL, "--keep-last",    "0",    "keep only the newest N checkpoints in -o (0: all of them)") \
    X(I, resume,        "-y", "--resume",       "0",    "1: resume from the latest checkpoint in -o") \
    X(S, init_ckpt,     "-e", "--init",         "",     "start from this checkpoint (its config wins)") \
    X(I, generate,      NULL, "--generate",     "0",    "with -e: generate N tokens from --prompt and exit") \
    X(S, prompt,        NULL, "--prompt",       "",     "generation prompt: text with --tokenizer, else token ids (spaces/commas)") \
    X(F, temperature,   NULL, "--temperature",  "1.0",  "sampling temperature (0: greedy)") \
    X(I, top_k,         NULL, "--top-k",        "0",    "sample from the k most likely tokens (0: all)") \
    X(I, threads,       NULL, "--threads",      "0",    "OpenMP threads (0: all cores)") \
    X(S, debug_state,   NULL, "--debug-state",  "",     "write one step's inputs, logits, loss and grads to FILE and exit") \
    X(S, eval,          NULL, "--eval",         "",     "with -e: evaluate and exit: sniah1 | sniah2 | sniah3 (RULER S-NIAH) | mc (multiple choice) | ppl") \
    X(S, eval_len,      NULL, "--eval-len",     "1024,2048,4096,8192", "--eval sniah: lengths (prompt + --eval-gen); ppl: window lengths") \
    X(S, eval_depths,   NULL, "--eval-depths",  "0,25,50,75,100", "--eval sniah: needle depths, percent of the haystack") \
    X(I, eval_samples,  NULL, "--eval-samples", "10",   "--eval sniah: samples per (length, depth), drawn from --seed") \
    X(I, eval_gen,      NULL, "--eval-gen",     "128",  "--eval sniah: tokens generated at most (RULER: 128)") \
    X(S, haystack,      NULL, "--haystack",     "",     "--eval sniah2/sniah3: a natural text FILE for the haystack") \
    X(S, eval_file,     NULL, "--eval-file",    "",     "--eval mc: the eval FILE in llm.c's format (dev/data/hellaswag.py)") \
    X(I, eval_tokens,   NULL, "--eval-tokens",  "16384", "--eval mc / ppl: tokens per forward pass (rows x length)") \
    X(L, eval_windows,  NULL, "--eval-windows", "0",    "--eval ppl: windows per length (0: every window of -j)") \
    X(S, export_hf,     NULL, "--export-hf",    "",     "with -e: write the checkpoint as an fla / Hugging Face directory DIR and exit") \
    X(S, export_dtype,  NULL, "--export-dtype", "fp32", "--export-hf tensor type: fp32 | bf16 (round to nearest even)") \
    X(S, import_hf,     NULL, "--import-hf",    "",     "read an fla / Hugging Face directory DIR, write -o OUTDIR/model_00000000.bin, exit") \
    X(I, world_size,    NULL, "--world-size",   "0",    "GPU trainer: processes in the job (0: the launcher's environment, else 1)") \
    X(I, rank,          NULL, "--rank",         "-1",   "GPU trainer: this process's rank (-1: the launcher's environment)") \
    X(I, local_rank,    NULL, "--local-rank",   "-1",   "GPU trainer: this process's GPU on its node (-1: launcher's, else rank % GPUs)") \
    X(S, dist_host,     NULL, "--dist-host",    "",     "GPU trainer, TCP rendezvous: rank 0's host; none: $MASTER_ADDR") \
    X(I, dist_port,     NULL, "--dist-port",    "0",    "GPU trainer, TCP rendezvous: rank 0's port (0: $MASTER_PORT, else 29500)") \
    X(S, dist_dir,      NULL, "--dist-dir",     "",     "GPU trainer, file rendezvous: a directory all processes share (one per job)") \
    X(I, dist_timeout,  NULL, "--dist-timeout", "600",  "GPU trainer: seconds a rendezvous or a step may wait for the other processes")

#define TRAIN_CTYPE_I int
#define TRAIN_CTYPE_L long
#define TRAIN_CTYPE_F float
#define TRAIN_CTYPE_S char*
#define TRAIN_DECLARE(type, field, s, l, def, help) TRAIN_CTYPE_##type field;
typedef struct {
    TRAIN_FIELDS(TRAIN_DECLARE)
    char preset[64];
    int preset_given, variant_given;   // --preset / --variant on the command line
    uint32_t model_flags_given;        // bit k: PDN_FIELDS[k]'s flag on the command line
    int count_params;   // --count-params: print the parameter count and exit
    int grad_accum;     // derived: total_batch / (B*T)
    int chunk_form;     // derived: 1 = chunkwise mixer, 0 = per-token
    int mqar_zoology;   // derived: 1 = --mqar-gen zoology
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
    errno = 0;
    long long v = strtoll(val, &end, 10);
    if (end == val || *end || errno == ERANGE) { return -1; }   // ERANGE: strtoll clamped it
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

// The paper's training recipe (MODEL.md §7), applied with the paper-size presets (340m, 1b); flags still win.
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
    printf("  %-28s %s\n", "--mqar-len N", "the MQAR example length: the same as -t");
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
            tc->preset_given = 1;
        }
        if (strcmp(argv[i], "--variant") == 0) { variant = argv[i + 1]; tc->variant_given = 1; }
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
            tc->model_flags_given |= 1u << k;
            done = 1;
        }
        for (int k = 0; k < TRAIN_NUM_FIELDS && !done; k++) {
            const TrainField* f = &TRAIN_FIELDS_TABLE[k];
            if (!((f->sflag && strcmp(a, f->sflag) == 0) || strcmp(a, f->lflag) == 0)) { continue; }
            if (train_field_set(tc, f, val) != 0) { fail(EXIT_USAGE, "bad value '%s' for %s (%s)", val, a, f->help); }
            done = 1;
        }
        if (strcmp(a, "--mqar-len") == 0) { // alias: the MQAR example length is the sequence length (-t), as strict
            const TrainField* t = NULL;
            for (int k = 0; k < TRAIN_NUM_FIELDS; k++) { if (strcmp(TRAIN_FIELDS_TABLE[k].name, "T") == 0) { t = &TRAIN_FIELDS_TABLE[k]; } }
            if (train_field_set(tc, t, val) != 0) { fail(EXIT_USAGE, "bad value '%s' for %s (%s)", val, a, t->help); }
            done = 1;
        }
        if (!done) { fail(EXIT_USAGE, "unknown flag '%s' (see --help)", a); }
    }
}

// bounds of the batch: a micro-batch's activations (B*T tokens times the model's widths, pdn.h's bounds) must fit in
// 64 bits, and a step's micro-batches in an int
#define PDN_MAX_TOKENS (1 << 24)
#define PDN_MAX_STEP_TOKENS (1L << 30)

// Check the training settings that do not depend on the model; derive grad_accum and the mixer form.
// nproc: number of data-parallel processes (1 on the CPU).
static void eval_config_check(const TrainConfig* tc); // eval.h: the --eval flags

static void train_config_check(TrainConfig* tc, int nproc) {
    if (tc->B < 1) { fail(EXIT_USAGE, "-b (micro-batch) must be >= 1, got %d", tc->B); }
    if (tc->T < 1) { fail(EXIT_USAGE, "-t (sequence length) must be >= 1, got %d", tc->T); }
    if ((long)tc->B * tc->T > PDN_MAX_TOKENS) {
        fail(EXIT_USAGE, "-b %d x -t %d = %ld tokens per micro-batch, more than %d\n  hint: use gradient accumulation (-d, "
             "tokens per step) for larger steps", tc->B, tc->T, (long)tc->B * tc->T, PDN_MAX_TOKENS);
    }
    long tok_per_micro = (long)tc->B * tc->T * nproc;
    if (tc->total_batch > PDN_MAX_STEP_TOKENS) {
        fail(EXIT_USAGE, "-d %ld (tokens per step) is more than %ld", tc->total_batch, PDN_MAX_STEP_TOKENS);
    }
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
    if (tc->recompute != 0 && tc->recompute != 1) { fail(EXIT_USAGE, "--recompute must be 0 or 1"); }
    if (tc->threads < 0 || tc->threads > 1024) { fail(EXIT_USAGE, "--threads must be in 0..1024 (0: all cores), got %d", tc->threads); }
    if (tc->warmup > tc->steps && tc->steps > 0 && !tc->generate && !tc->count_params && !tc->debug_state[0]) {
        fprintf(stderr, "warning: -u %d (warm-up steps) is longer than the run (-x %d): the learning rate rises to %.3g at the "
                "last step and never reaches -l %g; the cosine decay does not start\n", tc->warmup, tc->steps,
                tc->lr * (float)tc->steps / (float)tc->warmup, tc->lr);
    }
    if (tc->val_every < 0 || tc->val_batches < -1 || tc->ckpt_every < 0 || tc->gen_tokens < 0 || tc->generate < 0 ||
        tc->sample_every < 0 || tc->keep_last < 0 || tc->skip_nonfinite < 0) {
        fail(EXIT_USAGE, "-v, -m, -n, -g, -s, --generate, --keep-last and --skip-nonfinite must be >= 0 (-m -1: the whole "
             "validation split)");
    }
    if (tc->val[0] && !tc->train[0] && !tc->eval[0]) {
        fail(EXIT_USAGE, "-j (validation shards) needs -i (training shards): without -i the task is MQAR");
    }
    if (tc->sample_every && (!tc->train[0] || !tc->tokenizer[0])) {
        fail(EXIT_USAGE, "-s (samples) is for text (-i) and needs --tokenizer: samples start from its <|endoftext|> and "
             "are decoded with it");
    }
    if (strcmp(tc->mqar_gen, "pdn") == 0) { tc->mqar_zoology = 0; }
    else if (strcmp(tc->mqar_gen, "zoology") == 0) { tc->mqar_zoology = 1; }
    else { fail(EXIT_USAGE, "--mqar-gen must be pdn or zoology, got '%s'", tc->mqar_gen); }
    if (tc->mqar_zoology && tc->train[0]) { fail(EXIT_USAGE, "--mqar-gen zoology is for MQAR, not for text (-i)"); }
    if (tc->doc_mask != 0 && tc->doc_mask != 1) { fail(EXIT_USAGE, "--doc-mask must be 0 or 1, got %d", tc->doc_mask); }
    if (tc->doc_mask && !tc->train[0] && !tc->generate && !tc->eval[0] && !tc->export_hf[0] && !tc->import_hf[0]) {
        fail(EXIT_USAGE, "--doc-mask 1 is for text (-i): an MQAR sequence is one example, with no documents in it");
    }
    if (tc->eot_id < -1) { fail(EXIT_USAGE, "--eot-id must be a token id >= 0, or -1 for the tokenizer's, got %d", tc->eot_id); }
    if (tc->mqar_vocab < 0 || tc->mqar_train < 1 || tc->mqar_train > INT_MAX || tc->mqar_test < 1 || tc->mqar_test > INT_MAX) {
        fail(EXIT_USAGE, "need --mqar-vocab >= 0 and 1 <= --mqar-train, --mqar-test <= %d", INT_MAX);
    }
    if (!(tc->mqar_stop_acc >= 0 && tc->mqar_stop_acc <= 1)) {
        fail(EXIT_USAGE, "--mqar-stop-acc is a fraction in [0, 1] (Zoology stops above 0.99; 0: never), got %g", tc->mqar_stop_acc);
    }
    if (tc->val_batches == -1 && !tc->train[0] && !tc->mqar_zoology) {
        fail(EXIT_USAGE, "-m -1 (the whole validation split) is for text (-i/-j); MQAR's held-out stream has no end");
    }
    if (tc->resume && !tc->out_dir[0]) { fail(EXIT_USAGE, "-y 1 (resume) needs -o DIR, the directory holding the checkpoints"); }
    if (tc->resume && tc->init_ckpt[0]) { fail(EXIT_USAGE, "use either -y 1 (resume from -o) or -e FILE (init), not both"); }
    if (tc->generate && !tc->init_ckpt[0]) { fail(EXIT_USAGE, "--generate needs -e CHECKPOINT"); }
    eval_config_check(tc);
    if (!(tc->temperature >= 0) || tc->top_k < 0) { fail(EXIT_USAGE, "need --temperature >= 0 and --top-k >= 0"); }
    if (strcmp(tc->export_dtype, "fp32") != 0 && strcmp(tc->export_dtype, "bf16") != 0) {
        fail(EXIT_USAGE, "--export-dtype must be fp32 or bf16, got '%s'", tc->export_dtype);
    }
    if (tc->export_hf[0] && !tc->init_ckpt[0]) { fail(EXIT_USAGE, "--export-hf DIR needs -e CHECKPOINT, the checkpoint to export"); }
    if (tc->export_hf[0] && tc->import_hf[0]) { fail(EXIT_USAGE, "use either --export-hf or --import-hf, not both"); }
    if (tc->import_hf[0] && (!tc->out_dir[0] || tc->init_ckpt[0] || tc->resume)) {
        fail(EXIT_USAGE, "--import-hf DIR needs -o OUTDIR (where the pdn.c checkpoint goes) and no -e or -y");
    }
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

// the box shows the flags of the task being trained: MQAR's knobs for MQAR, the text flags for text
static int train_field_shown(const TrainConfig* tc, const TrainField* f) {
    static const char* const text_only[] = {"train", "val", "tokenizer", "sample_every", "doc_mask", "eot_id"};
    static const char* const procs[] = {"world_size", "rank", "local_rank"}; // a line after the box says it
    int text = tc->train[0] != 0;
    if (strncmp(f->name, "dist_", 5) == 0 || strstr(f->name, "_hf") || strcmp(f->name, "export_dtype") == 0) { return 0; }
    if (strncmp(f->name, "eval", 4) == 0 || strcmp(f->name, "haystack") == 0) { return 0; } // --eval prints no box
    for (size_t i = 0; i < sizeof(procs) / sizeof(procs[0]); i++) {
        if (strcmp(f->name, procs[i]) == 0) { return 0; }
    }
    if (strncmp(f->name, "mqar_", 5) == 0) { return !text; }
    for (size_t i = 0; i < sizeof(text_only) / sizeof(text_only[0]); i++) {
        if (strcmp(f->name, text_only[i]) == 0) { return text; }
    }
    return 1;
}

static void print_config_box(const PdnConfig* mc, const TrainConfig* tc, const PdnLayout* lay, const char* device,
                             const char* precision) {
    char v[PDN_VALUE_MAX];
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
        if (!train_field_shown(tc, f)) { continue; }
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
//   resume for the data order to continue exactly) / data_source (mqar | text | mqar-zoology: the kind of data
//   source, which a resume must use too) / doc_mask (-1, or the end-of-text id of --doc-mask 1; files without the line
//   are -1) / data_state (up to 16 u64 of the data source's position) / crc32 / end, then m[num_elems], v[num_elems]

#define DATA_STATE_MAX 16
#define DATA_MQAR 0
#define DATA_TEXT 1
#define DATA_ZOOLOGY 2
static const char* const DATA_KIND_NAME[3] = {"mqar", "text", "mqar-zoology"};
typedef struct {
    long step;
    uint32_t model_crc;
    int B, T, grad_accum, nproc;
    int data_kind;      // DATA_MQAR (0, what a zeroed state means) | DATA_TEXT | DATA_ZOOLOGY
    int doc_eot;        // --doc-mask 1: the end-of-text id that separates documents; -1: off (must match on resume)
    int n_data;
    uint64_t data[DATA_STATE_MAX];
} TrainState;

// a state file's header lines (before the crc32 line) into tb
static void state_header(TextBuf* tb, const TrainState* s, size_t num_elems, const char* dtype) {
    tb_printf(tb, "%s\nversion %d\nheader_bytes 0000000000\ndtype %s\nnum_elems %zu\nstep %ld\nmodel_crc %08x\n"
              "batch %d\nseq_len %d\ngrad_accum %d\nnproc %d\ndata_source %s\ndoc_mask %d\ndata_state %d", PDN_STATE_MAGIC,
              PDN_CKPT_VERSION, dtype, num_elems, s->step, s->model_crc, s->B, s->T, s->grad_accum, s->nproc,
              DATA_KIND_NAME[s->data_kind], s->doc_eot, s->n_data);
    for (int i = 0; i < s->n_data; i++) { tb_printf(tb, " %016llx", (unsigned long long)s->data[i]); }
    tb_printf(tb, "\n");
}

static void state_write(const char* path, const TrainState* s, const void* m, const void* v, size_t num_elems, const char* dtype) {
    TextBuf tb;
    memset(&tb, 0, sizeof tb);
    state_header(&tb, s, num_elems, dtype);
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
    // every count is range-checked before its cast (a tampered header must not wrap around to a plausible value)
    const char* keys[5] = {"step", "batch", "seq_len", "grad_accum", "nproc"};
    const long long lo[5] = {0, 1, 1, 1, 1};
    long long val5[5];
    for (int i = 0; i < 5; i++) {
        val5[i] = header_get_ll(&h, keys[i], path);
        if (val5[i] < lo[i] || val5[i] > INT_MAX) {
            fail(EXIT_BADFILE, "%s: %s %lld is out of range (corrupted header?)", path, keys[i], val5[i]);
        }
    }
    s->step = (long)val5[0];
    s->B = (int)val5[1];
    s->T = (int)val5[2];
    s->grad_accum = (int)val5[3];
    s->nproc = (int)val5[4];
    char val[512];
    if (!header_get(&h, "model_crc", val, sizeof val)) { fail(EXIT_BADFILE, "%s: no model_crc line", path); }
    s->model_crc = (uint32_t)strtoul(val, NULL, 16);
    s->data_kind = DATA_MQAR;   // state files written before text training have no data_source line: all MQAR
    if (header_get(&h, "data_source", val, sizeof val)) {
        s->data_kind = -1;
        for (int k = 0; k < 3; k++) { if (strcmp(val, DATA_KIND_NAME[k]) == 0) { s->data_kind = k; } }
        if (s->data_kind < 0) { fail(EXIT_BADFILE, "%s: unknown data_source '%s'", path, val); }
    }
    s->doc_eot = -1;
    if (header_get(&h, "doc_mask", val, sizeof val)) {
        char* end;
        long e = strtol(val, &end, 10);
        if (end == val || *end || e < -1 || e >= PDN_MAX_VOCAB) { fail(EXIT_BADFILE, "%s: bad doc_mask line '%s'", path, val); }
        s->doc_eot = (int)e;
    }
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
    // moments that are not finite come from a run that diverged: resuming from them would only make NaNs
    for (int k = 0; k < 2; k++) {
        for (size_t i = 0; i < num_elems; i++) {
            double x = strcmp(dtype, "f64") == 0 ? ((const double*)dsts[k])[i] : (double)((const float*)dsts[k])[i];
            if (!isfinite(x)) {
                fail(EXIT_BADFILE, "%s: AdamW moment %s element %zu is %g: a training state with non-finite values is refused "
                     "(it comes from a run that diverged, or was edited)\n  hint: resume from an earlier checkpoint", path,
                     k ? "v" : "m", i, x);
            }
        }
    }
}

// checkpoint file names inside the output directory
static void ckpt_paths(const char* dir, long step, char* model, char* state, size_t n) {
    snprintf(model, n, "%s/model_%08ld.bin", dir, step);
    snprintf(state, n, "%s/state_%08ld.bin", dir, step);
}

// the step of a checkpoint file name as ckpt_paths makes it (model_%08ld.bin, state_%08ld.bin); -1 for any other name
static long ckpt_file_step(const char* name) {
    if (strncmp(name, "model_", 6) != 0 && strncmp(name, "state_", 6) != 0) { return -1; }
    long step = strtol(name + 6, NULL, 10);
    char canon[64];
    snprintf(canon, sizeof canon, "%.6s%08ld.bin", name, step);
    return step >= 0 && strcmp(canon, name) == 0 ? step : -1;
}

// the latest step in dir for which both the model and the state file exist; -1 if none
static long find_latest_checkpoint(const char* dir) {
    DIR* d = opendir(dir);
    if (!d) { return -1; }
    long best = -1;
    struct dirent* e;
    while ((e = readdir(d)) != NULL) {
        long step = ckpt_file_step(e->d_name);
        if (step < 0 || e->d_name[0] != 's') { continue; }
        char mp[1100], sp[1100];
        ckpt_paths(dir, step, mp, sp, sizeof mp);
        if (file_exists(mp) && step > best) { best = step; }
    }
    closedir(d);
    return best;
}

static int cmp_long_desc(const void* a, const void* b) {
    long x = *(const long*)a, y = *(const long*)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

// --keep-last N, after the checkpoint of `step` was written: the newest N complete pairs (both files) at or before
// `step` stay, and every checkpoint file of an older step goes (a lone model or state file left by a crash too).
// A resume takes the newest complete pair, which is always kept; files of steps after `step` (another run's) are
// left alone.
static void prune_checkpoints(const char* dir, long step, int keep) {
    if (keep <= 0) { return; }
    DIR* d = opendir(dir);
    if (!d) { return; }
    size_t n = 0, cap = 64;
    long* steps = (long*)mallocCheck(cap * sizeof(long));
    struct dirent* e;
    while ((e = readdir(d)) != NULL) {
        long st = ckpt_file_step(e->d_name);
        if (st < 0 || st > step) { continue; }
        if (n == cap) { cap *= 2; steps = (long*)realloc(steps, cap * sizeof(long)); if (!steps) { fail(EXIT_SYSTEM, "out of memory"); } }
        steps[n++] = st;
    }
    closedir(d);
    qsort(steps, n, sizeof(long), cmp_long_desc);
    long oldest_kept = -1;
    int complete = 0;
    for (size_t i = 0; i < n && complete < keep; i++) {
        if (i > 0 && steps[i] == steps[i - 1]) { continue; }
        char mp[1100], sp[1100];
        ckpt_paths(dir, steps[i], mp, sp, sizeof mp);
        if (file_exists(mp) && file_exists(sp)) { complete++; oldest_kept = steps[i]; }
    }
    for (size_t i = 0; i < n && complete == keep; i++) {
        if (steps[i] >= oldest_kept || (i > 0 && steps[i] == steps[i - 1])) { continue; }
        char mp[1100], sp[1100];
        ckpt_paths(dir, steps[i], mp, sp, sizeof mp);
        int gone = unlink(mp) == 0 || errno == ENOENT;
        gone = (unlink(sp) == 0 || errno == ENOENT) && gone;
        if (gone) { printf("removed the checkpoint of step %ld (--keep-last %d)\n", steps[i], keep); }
        else { printf("warning: cannot remove the checkpoint of step %ld (--keep-last %d): %s\n", steps[i], keep, strerror(errno)); }
    }
    free(steps);
}

// ----------------------------------------------------------------------------------------------------
// the debug-state file (--debug-state FILE): one micro-batch's inputs, logits, loss and every parameter gradient,
// for a given checkpoint and batch, from either trainer; `test_pdn --compare A B` compares two of them.
//
//   PDNDEBUG / version 1 / header_bytes / batch B / seq_len T / vocab_size / num_elems / loss (%.17g) /
//   precision (what produced it) / the config lines of the checkpoint format / crc32 / end
//   then int32 x[B*T], int32 y[B*T], f32 logits[B*T*vocab], f32 grads[num_elems] (the flat layout of pdn.h)

#define PDN_DEBUG_MAGIC "PDNDEBUG"

typedef struct {
    PdnConfig cfg;
    PdnLayout lay;
    int B, T;
    double loss;
    char precision[32];
    int *x, *y;
    float *logits, *grads;
} DebugState;

static void debug_state_write(const char* path, const DebugState* d) {
    TextBuf tb;
    memset(&tb, 0, sizeof tb);
    tb_printf(&tb, "%s\nversion %d\nheader_bytes 0000000000\nbatch %d\nseq_len %d\nvocab_size %d\nnum_elems %zu\n"
              "loss %.17g\nprecision %s\n", PDN_DEBUG_MAGIC, PDN_CKPT_VERSION, d->B, d->T, d->cfg.vocab_size,
              d->lay.num_elems, d->loss, d->precision);
    pdn_config_to_header(&d->cfg, &tb);
    size_t N = (size_t)d->B * d->T;
    const void* bufs[4] = {d->x, d->y, d->logits, d->grads};
    size_t nb[4] = {N * 4, N * 4, N * d->cfg.vocab_size * 4, d->lay.num_elems * 4};
    write_headed_file(path, &tb, bufs, nb, 4);
    free(tb.s);
}

__attribute__((unused)) static void debug_state_read(const char* path, DebugState* d) {
    FILE* f = fopenCheck(path, "rb");
    Header h;
    header_read(f, path, PDN_DEBUG_MAGIC, &h);
    memset(d, 0, sizeof(*d));
    pdn_config_from_header(&d->cfg, &h, path);
    pdn_build_layout(&d->cfg, &d->lay);
    d->B = (int)header_get_ll(&h, "batch", path);
    d->T = (int)header_get_ll(&h, "seq_len", path);
    if ((size_t)header_get_ll(&h, "num_elems", path) != d->lay.num_elems) { fail(EXIT_BADFILE, "%s: num_elems does not match its config", path); }
    char v[64];
    if (!header_get(&h, "loss", v, sizeof v)) { fail(EXIT_BADFILE, "%s: no loss line", path); }
    d->loss = strtod(v, NULL);
    if (!header_get(&h, "precision", d->precision, sizeof d->precision)) { fail(EXIT_BADFILE, "%s: no precision line", path); }
    size_t N = (size_t)d->B * d->T;
    d->x = (int*)mallocCheck(N * 4);
    d->y = (int*)mallocCheck(N * 4);
    d->logits = (float*)mallocCheck(N * d->cfg.vocab_size * 4);
    d->grads = (float*)mallocCheck(d->lay.num_elems * 4);
    void* dsts[4] = {d->x, d->y, d->logits, d->grads};
    size_t nb[4] = {N * 4, N * 4, N * d->cfg.vocab_size * 4, d->lay.num_elems * 4};
    headed_read_data(f, path, &h, dsts, nb, 4);
    fclose(f);
    free(h.text);
}

__attribute__((unused)) static void debug_state_free(DebugState* d) {
    free(d->x); free(d->y); free(d->logits); free(d->grads);
    memset(d, 0, sizeof(*d));
}

// Compare a debug state `got` against a reference `ref` (same config, batch and tokens). For the loss, the
// logits and every parameter tensor, prints the max error relative to the tensor's largest reference value
// (max |got - ref| / max |ref|) and the L2 error ||got - ref|| / ||ref||, each checked against a tolerance:
// max_tol applies to the max-relative error (the fp32 criterion), l2_tol to the L2 error (the bf16 criterion;
// < 0 disables a check). Returns the number of failing entries.
__attribute__((unused)) static int debug_state_compare(const DebugState* ref, const DebugState* got, double max_tol, double l2_tol) {
    if (memcmp(&ref->cfg, &got->cfg, sizeof(PdnConfig)) != 0 || ref->B != got->B || ref->T != got->T) {
        printf("FAIL: the two files describe different models or batches\n");
        return 1;
    }
    size_t N = (size_t)ref->B * ref->T;
    if (memcmp(ref->x, got->x, N * 4) != 0 || memcmp(ref->y, got->y, N * 4) != 0) {
        printf("FAIL: the two files were made from different batches\n");
        return 1;
    }
    int fails = 0;
    printf("%-16s %12s %12s %12s  %s\n", "tensor", "max|ref|", "max rel err", "L2 rel err", "verdict");
    // entry -1: loss, 0: logits, then every tensor
    for (int e = -1; e <= NUM_TENSORS; e++) {
        const float *a, *b;
        size_t n;
        char name[32];
        float la = (float)got->loss, lb = (float)ref->loss;
        if (e == -1) { a = &la; b = &lb; n = 1; snprintf(name, sizeof name, "loss"); }
        else if (e == 0) { a = got->logits; b = ref->logits; n = N * ref->cfg.vocab_size; snprintf(name, sizeof name, "logits"); }
        else {
            const PdnTensor* t = &ref->lay.t[e - 1];
            if (!t->numel) { continue; }
            a = got->grads + t->offset; b = ref->grads + t->offset; n = t->numel;
            snprintf(name, sizeof name, "d%s", t->name);
        }
        double md = 0, mb = 0, sd = 0, sb = 0;
        int bad = 0;
        for (size_t i = 0; i < n; i++) {
            double d = fabs((double)a[i] - (double)b[i]);
            if (!isfinite(a[i])) { bad = 1; }
            md = d > md ? d : md;
            mb = fabs(b[i]) > mb ? fabs(b[i]) : mb;
            sd += d * d;
            sb += (double)b[i] * b[i];
        }
        double mrel = mb > 0 ? md / mb : md, l2 = sb > 0 ? sqrt(sd / sb) : sqrt(sd);
        // per-head decay/scale vectors (A_log, dt_bias, log_atk_scale) sum B*T*H cancelling terms: twice the L2 budget
        int gate_vec = e > 0 && (ref->lay.t[e - 1].init == INIT_ALOG || ref->lay.t[e - 1].init == INIT_DTBIAS ||
                                 ref->lay.t[e - 1].init == INIT_LOGATK);
        double l2t = l2_tol < 0 ? l2_tol : (gate_vec ? 2 * l2_tol : l2_tol);
        int ok = !bad && (max_tol < 0 || mrel <= max_tol) && (l2t < 0 || l2 <= l2t);
        fails += !ok;
        printf("%-16s %12.4e %12.3e %12.3e  %s\n", name, mb, mrel, l2, ok ? "ok" : "FAIL");
    }
    printf("%s: %d of the compared entries out of tolerance (max rel <= %g, L2 rel <= %g; 2x for gate vectors)\n",
           fails ? "FAIL" : "PASS", fails, max_tol, l2_tol);
    return fails;
}

// ----------------------------------------------------------------------------------------------------
// log file: <out_dir>/main.log, one line per event ("s:STEP key:value ..."). A write that fails (a full disk) ends
// the run (exit 4): a log with holes would pass for a complete one.

typedef struct { char path[1100]; int active; } Logger;

// A new run starts an empty log; a resumed one keeps the lines of the steps up to resume_step and drops the later
// ones (those steps run again), so that every step appears once.
static void logger_init(Logger* lg, const char* dir, long resume_step) {
    lg->active = dir && dir[0];
    if (!lg->active) { return; }
    snprintf(lg->path, sizeof lg->path, "%s/main.log", dir);
    FILE* in = resume_step > 0 ? fopen(lg->path, "r") : NULL;
    if (!in) { fclose(fopenCheck(lg->path, "w")); return; }
    AtomicFile af;
    int err = atomic_try_open(&af, lg->path);
    char line[4096];
    long dropped = 0;
    while (!err && fgets(line, sizeof line, in)) {
        long st;
        if (sscanf(line, "s:%ld", &st) == 1 && st > resume_step) { dropped++; continue; }
        err = atomic_try_write(&af, line, strlen(line));
    }
    fclose(in);
    if (!err) { err = atomic_try_finish(&af); }
    if (!err) { err = atomic_try_rename(&af); }
    if (err) { atomic_fail(&af, err); }
    if (dropped) { printf("%s: dropped %ld lines of the steps after %ld (they run again)\n", lg->path, dropped, resume_step); }
}

static void logger_printf(Logger* lg, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static void logger_printf(Logger* lg, const char* fmt, ...) {
    if (!lg->active) { return; }
    FILE* f = fopenCheck(lg->path, "a");
    va_list ap;
    va_start(ap, fmt);
    int bad = vfprintf(f, fmt, ap) < 0;
    va_end(ap);
    bad |= fclose(f) != 0;
    if (bad) { fail(EXIT_SYSTEM, "cannot write '%s': %s\n  hint: is the disk full?", lg->path, strerror(errno)); }
}

// The time per step behind the ETA: the mean of the last STEP_WINDOW timed steps, so that the estimate follows the
// run's current speed (another job on the machine, a change of data) rather than the average since the start.
#define STEP_WINDOW 20
typedef struct { double dt[STEP_WINDOW]; long n; } StepTimes;

static void step_times_add(StepTimes* st, double dt) { st->dt[st->n % STEP_WINDOW] = dt; st->n++; }

// the recent mean (0 before any step)
static double step_times_mean(const StepTimes* st) {
    long k = st->n < STEP_WINDOW ? st->n : STEP_WINDOW;
    double s = 0.0;
    for (long i = 0; i < k; i++) { s += st->dt[i]; }
    return k ? s / k : 0.0;
}

static void format_eta(double seconds, char* out, size_t n) {
    if (seconds < 0) { seconds = 0; }
    long s = (long)(seconds + 0.5);
    if (s >= 3600) { snprintf(out, n, "%ldh%02ldm", s / 3600, (s / 60) % 60); }
    else { snprintf(out, n, "%ldm%02lds", s / 60, s % 60); }
}

// ----------------------------------------------------------------------------------------------------
// pieces of main() that both trainers share

// Sample from logits (Vv): temperature 0 = greedy; top_k > 0 keeps the k largest logits.
static int sample_logits(const float* logits, int Vv, float temperature, int top_k, Rng* rng) {
    int best = 0;
    for (int i = 1; i < Vv; i++) { if (logits[i] > logits[best]) { best = i; } }
    if (temperature <= 0) { return best; }
    double* w = (double*)mallocCheck(Vv * sizeof(double));
    double thresh = -INFINITY;
    if (top_k > 0 && top_k < Vv) {
        // the k-th largest logit by repeated selection of the max below the previous one (k is small)
        for (int i = 0; i < Vv; i++) { w[i] = logits[i]; }
        for (int r = 0; r < top_k; r++) {
            int bi = -1;
            for (int i = 0; i < Vv; i++) { if (w[i] != -INFINITY && (bi < 0 || w[i] > w[bi])) { bi = i; } }
            thresh = w[bi];
            w[bi] = -INFINITY;
        }
    }
    double sum = 0.0, mx = logits[best];
    for (int i = 0; i < Vv; i++) {
        w[i] = logits[i] >= thresh ? exp((logits[i] - mx) / temperature) : 0.0;
        sum += w[i];
    }
    double u = rng_uniform(rng) * sum, acc = 0.0;
    int pick = best;
    for (int i = 0; i < Vv; i++) {
        if (w[i] == 0) { continue; }
        acc += w[i];
        pick = i;
        if (u < acc) { break; }
    }
    free(w);
    return pick;
}

// parse "1 2 3" or "1,2,3" into token ids, each checked against the vocabulary as written (before any cast, so
// 4294967299 is refused rather than read as 3)
static int parse_prompt(const char* s, int* out, int max, int vocab_size) {
    int n = 0;
    while (*s) {
        while (*s == ' ' || *s == ',') { s++; }
        if (!*s) { break; }
        char* end;
        errno = 0;
        long long v = strtoll(s, &end, 10);
        if (end == s) { fail(EXIT_USAGE, "--prompt must be token ids separated by spaces or commas, got '%s'", s); }
        if (errno == ERANGE || v < 0 || v >= vocab_size) {
            fail(EXIT_USAGE, "--prompt token %.*s is outside the model's vocabulary [0, %d)", (int)(end - s), s, vocab_size);
        }
        if (n >= max) { fail(EXIT_USAGE, "--prompt has more than %d tokens", max); }
        out[n++] = (int)v;
        s = end;
    }
    return n;
}

// With -y 1 or -e the checkpoint's model config is used: model flags asking for another model (a field given by its
// flag, or set by an explicit --preset or --variant) are refused rather than silently ignored. flags: the config the
// command line describes; ck: the checkpoint's.
static void check_model_flags(const TrainConfig* tc, const PdnConfig* flags, const PdnConfig* ck, const char* path) {
    static const char* const by_variant[] = {"decay", "precond", "out_gate"};
    char diff[1024] = "", a[PDN_VALUE_MAX], b[PDN_VALUE_MAX];
    PdnConfig f = *flags;
    if (f.mlp_hidden == 0) { f.mlp_hidden = pdn_default_mlp_hidden(f.d_model); }   // as pdn_config_check fills it
    if (layerset_count(&f.attn_layers) && f.attn_heads == 0) { f.attn_heads = f.n_head; }
    if (layerset_count(&f.attn_layers) && f.attn_kv_heads == 0) { f.attn_kv_heads = f.attn_heads; }
    for (int k = 0; k < PDN_NUM_FIELDS; k++) {
        const PdnField* fd = &PDN_FIELDS[k];
        int set = (tc->model_flags_given >> k) & 1;
        if (tc->preset_given && strcmp(fd->name, "ridge") != 0) { set = 1; }   // a preset sets every knob but the ridge
        for (int v = 0; v < 3; v++) { if (tc->variant_given && strcmp(fd->name, by_variant[v]) == 0) { set = 1; } }
        if (strcmp(fd->name, "vocab_size") == 0 && f.vocab_size == 0) { set = 0; }   // 0: from the data
        if (!set) { continue; }
        pdn_field_str(&f, fd, a, sizeof a);
        pdn_field_str(ck, fd, b, sizeof b);
        if (strcmp(a, b) != 0) {   // a long layer list is cut at 150 characters
            char item[400];
            snprintf(item, sizeof item, "%s%.40s %.150s (the flags ask for %.150s)", diff[0] ? ", " : "", fd->name, b, a);
            if (strlen(diff) + strlen(item) < sizeof diff) { strcat(diff, item); }
        }
    }
    if (diff[0]) {
        fail(EXIT_USAGE, "%s holds another model than the flags%s%s%s describe: %s\n  hint: leave out the model flags (with "
             "%s the checkpoint's config is used)%s", path, tc->preset_given ? " (--preset " : "",
             tc->preset_given ? tc->preset : "", tc->preset_given ? ")" : "", diff, tc->resume ? "-y 1" : "-e",
             tc->resume ? "; to train the new model, use another -o" : "");
    }
}

// Where the model comes from: -y 1 with a checkpoint in -o (then *resume_state names its state file), or -e FILE,
// or nothing (init from flags). Loaded parameters go to *loaded (caller frees); returns 1 if a file was read.
static int load_model_source(const TrainConfig* tc, PdnConfig* mc, real** loaded, uint32_t* crc, char* resume_state, size_t n) {
    PdnLayout lay;
    resume_state[0] = 0;
    *loaded = NULL;
    if (tc->resume) {
        ensure_dir(tc->out_dir);
        long latest = find_latest_checkpoint(tc->out_dir);
        if (latest < 0) { printf("no checkpoint in %s: starting from scratch\n", tc->out_dir); return 0; }
        char mp[1100];
        ckpt_paths(tc->out_dir, latest, mp, resume_state, n);
        PdnConfig flags = *mc;
        pdn_checkpoint_read(mp, mc, &lay, loaded, crc);
        check_model_flags(tc, &flags, mc, mp);
        printf("resuming from %s\n", mp);
        return 1;
    }
    if (tc->init_ckpt[0]) {
        PdnConfig flags = *mc;
        pdn_checkpoint_read(tc->init_ckpt, mc, &lay, loaded, crc);
        check_model_flags(tc, &flags, mc, tc->init_ckpt);
        return 1;
    }
    return 0;
}

// --count-params: one line per tensor, the total as the last line
static void print_param_table(const PdnConfig* mc) {
    PdnLayout lay;
    pdn_build_layout(mc, &lay);
    char shape[64];
    for (int i = 0; i < NUM_TENSORS; i++) {
        if (!lay.t[i].numel) { continue; }
        tensor_shape_str(&lay.t[i], shape, sizeof shape);
        printf("%-14s %-16s %12zu%s\n", lay.t[i].name, shape, lay.t[i].numel, lay.t[i].wd ? "  wd" : "");
    }
    printf("%zu\n", lay.num_params);
}

// warn about configurations outside the paper's stability argument
static void warn_eigen_bound(const PdnConfig* mc) {
    if (pdn_eigen_bound_broken(mc)) {
        printf("warning: allow_neg_eigval (beta up to 2) with squash x = %g breaks beta*x <= 2, the eigenvalue bound of "
               "the paper (App. E.3); training may be unstable\n", mc->squash_x);
    }
}

// the MQAR task must fit the model
static void check_task(const MqarConfig* mq, int zoology, const PdnConfig* mc) {
    const char* merr = zoology ? mqar_check_zoology(mq) : mqar_check(mq);
    if (merr) { fail(EXIT_USAGE, "%s", merr); }
    if (mq->vocab > mc->vocab_size) {
        fail(EXIT_USAGE, "MQAR vocabulary %d is larger than the model's vocabulary %d (set --vocab or --mqar-vocab)", mq->vocab, mc->vocab_size);
    }
    warn_eigen_bound(mc);
}

// the per-step line and its log-file twin. mfu < 0: unknown peak, not printed
static void print_step(Logger* lg, const TrainConfig* tc, long step, double loss, double norm, float lr, double dt,
                       double per_step, double mfu) {
    char eta[32], mf[32] = "";
    format_eta(per_step * (tc->steps - step - 1), eta, sizeof eta);
    if (mfu >= 0) { snprintf(mf, sizeof mf, " | %5.1f%% MFU", 100 * mfu); }
    printf("step %5ld/%d | loss %.6f | norm %8.4f | lr %.2e | %7.1f ms | %8.0f tok/s%s | eta %s\n", step + 1, tc->steps,
           loss, norm, lr, dt * 1e3, tc->total_batch / dt, mf, eta);
    logger_printf(lg, "s:%ld trl:%.9g norm:%.9g lr:%.6e ms:%.1f\n", step + 1, loss, norm, lr, dt * 1e3);
}

// ----------------------------------------------------------------------------------------------------
// the data source: what a trainer learns from, either MQAR (mqar.h; the default: generated from a seeded stream, or
// with --mqar-gen zoology Zoology's fixed training and test sets) or text from token shards (dataloader.h; -i
// TRAIN_GLOB, -j VAL_GLOB). It deals only in int tokens and targets, so both trainers share it:
//   data_init             opens it, and fills in the model's vocabulary where the preset leaves it at 0
//   data_next             one micro-batch x[B*T], y[B*T] (text: y = the next tokens; MQAR: -1 where no target)
//   data_save / restore   its position in the training state (data_kind, n_data, data[]), so -y 1 is exact
//   data_val_begin / next the held-out batches of one evaluation, the same ones every time: MQAR a fixed stream
//                         (-m batches), Zoology's MQAR its whole test set, text the first -m batches of the
//                         validation split (-1: all of it)
// Processes: rank `rank` of `world` gets its own micro-batches. Text: the loader's slicing. MQAR: every rank draws
// the world batches of a micro-step from the one stream and keeps its own (Zoology's: batch r of each group of world
// in the training order), so the saved position is the same on every rank and world = 1 is the single-process
// stream. Held-out batches are the same on every rank for MQAR; for text each rank evaluates its slice of the
// validation split.

typedef struct {
    int kind;                 // DATA_MQAR | DATA_TEXT | DATA_ZOOLOGY (MQAR with Zoology's generator)
    int B, T, rank, world;
    uint64_t seed;
    MqarConfig mq;            // MQAR: the task,
    Rng rng, val_rng;         //   the training stream (4 words: its whole position) and the held-out stream
    uint64_t train_seed, test_seed; // Zoology's: the two sets' seeds,
    long n_train, n_test;     //   their sizes,
    long zpos, vpos;          //   batches of the training order served so far (every rank's), the next test batch
    int *xs, *ys;             //   with world > 1: where the other ranks' batches are drawn and dropped
    DataLoader train, val;    // text: the training loader (shuffled by --seed) and, if has_val, the validation one
    int has_val;
    long val_batches;         // held-out batches per evaluation (0: no evaluation data)
    const char* vocab_from;   // text: where the model's vocabulary came from (printed by data_describe)
    char vocab_note[1200];    //   (when from the shards: which id of which shard)
    int doc_eot;              // --doc-mask 1: the end-of-text id, else -1 (data_docs_on)
    int* doc;                 // (B*T) with --doc-mask 1: every token's document start in its row (the model's doc), else NULL
} DataSource;

// the largest token id in a loader's shards (all of their tokens, read in 1M-token parts), and where it first occurs
typedef struct { uint32_t id; int shard; uint64_t pos; } MaxToken;
static MaxToken data_max_token(const DataLoader* dl) {
    const size_t part = 1 << 20;
    uint32_t* buf = (uint32_t*)mallocCheck(part * sizeof(uint32_t));
    MaxToken mx = {0, 0, 0};
    for (int s = 0; s < dl->n_shards; s++) {
        int fd = shard_open_fd(dl->paths[s]);
        for (uint64_t at = 0; at < dl->info[s].count; at += part) {
            size_t n = dl->info[s].count - at < part ? (size_t)(dl->info[s].count - at) : part;
            shard_read_tokens(fd, dl->paths[s], &dl->info[s], at, n, buf);
            for (size_t i = 0; i < n; i++) {
                if (buf[i] > mx.id) { mx.id = buf[i]; mx.shard = s; mx.pos = at + i; }
            }
        }
        close(fd);
    }
    free(buf);
    return mx;
}

// Opens the data source the flags describe: text if -i is given, else MQAR. *vocab_size is the model's vocabulary;
// 0 (tiny/small presets) means "from the data": MQAR's --mqar-vocab, or for text the tokenizer's size (tok_vocab
// > 0) or else the largest id in the training and validation shards + 1. The loaders then check every id they
// serve against it (exit 2 on an id outside the model's vocabulary).
static void data_init(DataSource* ds, const TrainConfig* tc, int tok_vocab, int* vocab_size, int rank, int world) {
    memset(ds, 0, sizeof(*ds));
    ds->B = tc->B; ds->T = tc->T; ds->rank = rank; ds->world = world; ds->seed = (uint64_t)tc->seed; ds->doc_eot = -1;
    if (!tc->train[0]) {
        ds->kind = tc->mqar_zoology ? DATA_ZOOLOGY : DATA_MQAR;
        int vocab = tc->mqar_vocab ? tc->mqar_vocab : tc->mqar_zoology ? 8192 : 64; // Zoology's default vocabulary
        ds->mq.vocab = vocab; ds->mq.seq_len = tc->T; ds->mq.pairs = tc->mqar_pairs; ds->mq.power_a = tc->mqar_power_a;
        if (*vocab_size == 0) { *vocab_size = vocab; }
        mqar_zoology_seeds((uint64_t)tc->mqar_data_seed, &ds->train_seed, &ds->test_seed);
        ds->n_train = tc->mqar_train; ds->n_test = tc->mqar_test;
        uint64_t sm = ds->seed ^ 0x7261696E;
        rng_seed(&ds->rng, splitmix64(&sm));
        ds->val_batches = tc->val_batches;
        if (world > 1) {
            ds->xs = (int*)mallocCheck((size_t)tc->B * tc->T * sizeof(int));
            ds->ys = (int*)mallocCheck((size_t)tc->B * tc->T * sizeof(int));
        }
        return;
    }
    ds->kind = DATA_TEXT;
    // until the vocabulary is settled (below) the loaders accept any id
    dataloader_init(&ds->train, tc->train, tc->B, tc->T, rank, world, INT_MAX, 1, ds->seed);
    if (tc->val[0] && tc->val_batches != 0) {
        dataloader_init_val(&ds->val, tc->val, tc->B, tc->T, rank, world, INT_MAX, tc->val_batches);
        ds->has_val = 1;
        ds->val_batches = dataloader_num_batches(&ds->val);
    }
    ds->vocab_from = "set by the preset, --vocab or the checkpoint";
    if (*vocab_size == 0 && tok_vocab > 0) {
        *vocab_size = tok_vocab;
        ds->vocab_from = "the tokenizer's";
    } else if (*vocab_size == 0) {
        MaxToken mx = data_max_token(&ds->train), mv = {0, 0, 0};
        const DataLoader* at = &ds->train;
        if (ds->has_val) { mv = data_max_token(&ds->val); }
        if (mv.id > mx.id) { mx = mv; at = &ds->val; }
        if (mx.id >= PDN_MAX_VOCAB) {   // one stray id would otherwise size the model (and fail as out of memory)
            fail(EXIT_BADFILE, "%s: token id %u at position %llu is larger than any vocabulary (at most %d ids): a "
                 "corrupted shard, or one made with another tokenizer?\n  hint: set --vocab (then every id at or above it "
                 "is refused with its position), or --tokenizer", at->paths[mx.shard], mx.id, (unsigned long long)mx.pos,
                 PDN_MAX_VOCAB);
        }
        *vocab_size = (int)mx.id + 1;
        snprintf(ds->vocab_note, sizeof ds->vocab_note, "the largest token id in the shards + 1: id %u at position %llu of %s",
                 mx.id, (unsigned long long)mx.pos, at->paths[mx.shard]);
        ds->vocab_from = ds->vocab_note;
    }
    ds->train.vocab_size = *vocab_size;
    if (ds->has_val) { ds->val.vocab_size = *vocab_size; }
}

static void data_free(DataSource* ds) {
    if (ds->kind == DATA_TEXT) {
        dataloader_free(&ds->train);
        if (ds->has_val) { dataloader_free(&ds->val); }
    }
    free(ds->xs);
    free(ds->ys);
    free(ds->doc);
    memset(ds, 0, sizeof(*ds));
}

// a loader's next batch into x, y; with documents their starts into ds->doc: each token gets its segment's start in
// its row (segments never cross rows)
static void data_loader_batch(DataSource* ds, DataLoader* dl, int* x, int* y) {
    dataloader_next(dl);
    memcpy(x, dl->inputs, (size_t)dl->B * dl->T * sizeof(int));
    memcpy(y, dl->targets, (size_t)dl->B * dl->T * sizeof(int));
    if (!ds->doc) { return; }
    for (int i = 0; i < dl->n_seg; i++) {
        for (int n = dl->seg[i]; n < dl->seg[i + 1]; n++) { ds->doc[n] = dl->seg[i] % dl->T; }
    }
}

// --doc-mask 1: the loaders find the documents after each end-of-text id eot in every batch
static void data_docs_on(DataSource* ds, int eot) {
    ds->doc_eot = eot;
    if (eot < 0) { return; }
    dataloader_set_eot(&ds->train, eot);
    if (ds->has_val) { dataloader_set_eot(&ds->val, eot); }
    ds->doc = (int*)mallocCheck((size_t)ds->B * ds->T * sizeof(int));
}

// The packed documents as the GPU's mixer reads them on its fixed grid of chunks of C (train_pdn.cu, ChunkShape.doc),
// from doc (B, T): every token's document start in its row (train_pdn.c's doc). rel (B, Tp), Tp = T rounded up to
// whole chunks: for each position t, the row of t's chunk where t's document starts if it starts inside that chunk,
// else -1 (it came in from before the chunk, or it is the window's first: a row's start continues from the given
// start state, as without documents). Positions t >= T (padding) take the last token's value. So, in one chunk: rows
// i and j are in one document iff rel_i == rel_j; row i sees the chunk's start state iff rel_i == -1; the start
// state reaches the next chunk iff rel of the last row is -1; row i is a document's first token iff rel_i == i.
// conv (B, T): how many earlier tokens of its document each token has, capped at 255: the short convolution's taps
// j <= conv[t] (reading t - j) stay inside the document.
static void doc_chunk_rel(const int* doc, int B, int T, int C, signed char* rel, unsigned char* conv) {
    int Tp = (T + C - 1) / C * C;
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < Tp; t++) {
            int tt = t < T ? t : T - 1, d = doc[(size_t)b * T + tt], t0 = t / C * C;
            rel[(size_t)b * Tp + t] = (signed char)(d > t0 || (d == t0 && t0 > 0) ? d - t0 : -1);
        }
        for (int t = 0; t < T; t++) {
            int n = t - doc[(size_t)b * T + t];
            conv[(size_t)b * T + t] = (unsigned char)(n < 255 ? n : 255);
        }
    }
}

// one micro-batch of this rank: x, y of B*T ints (and ds->doc with documents)
static void data_next(DataSource* ds, int* x, int* y) {
    if (ds->kind == DATA_TEXT) { data_loader_batch(ds, &ds->train, x, y); return; }
    if (ds->kind == DATA_ZOOLOGY) { // batch g of the order: the epoch's batch g % nb, the last one short
        long nb = (ds->n_train + ds->B - 1) / ds->B, g = ds->zpos + ds->rank;
        ds->zpos += ds->world;
        mqar_zoology_batch(&ds->mq, ds->train_seed, ds->n_train, (g % nb) * ds->B, ds->B, x, y);
        return;
    }
    for (int r = 0; r < ds->world; r++) {
        mqar_batch(&ds->mq, &ds->rng, ds->B, r == ds->rank ? x : ds->xs, r == ds->rank ? y : ds->ys);
    }
}

// Zoology's MQAR in the training state: the batches served, then the settings that make the sets (a resume must
// make the same ones)
#define ZOOLOGY_STATE_WORDS 8
static void data_zoology_words(const DataSource* ds, uint64_t* w) {
    uint32_t pa;
    memcpy(&pa, &ds->mq.power_a, sizeof pa);
    w[0] = (uint64_t)ds->zpos; w[1] = ds->train_seed; w[2] = ds->test_seed; w[3] = (uint64_t)ds->n_train;
    w[4] = (uint64_t)ds->n_test; w[5] = (uint64_t)ds->mq.vocab; w[6] = (uint64_t)ds->mq.pairs; w[7] = pa;
}

// the position, into the training state: MQAR the 4 words of its stream, Zoology's MQAR its 8 words, text the
// loader's 9 words
static void data_save(const DataSource* ds, TrainState* st) {
    st->data_kind = ds->kind;
    if (ds->kind == DATA_TEXT) { dataloader_save_state(&ds->train, st->data, &st->n_data); return; }
    if (ds->kind == DATA_ZOOLOGY) { data_zoology_words(ds, st->data); st->n_data = ZOOLOGY_STATE_WORDS; return; }
    st->n_data = 4;
    for (int i = 0; i < 4; i++) { st->data[i] = ds->rng.s[i]; }
}

// continue from a saved position; a state saved by the other kind of data source is refused (exit 1), as is a text
// position saved with other loader settings or other shards (the loader's fingerprint)
static void data_restore(DataSource* ds, const TrainState* st, const char* path) {
    static const char* const what[3] = {"MQAR (no -i)", "text (-i)", "Zoology's MQAR (--mqar-gen zoology)"};
    static const char* const how[3] = {"no -i or -j, --mqar-gen pdn", "-i TRAIN_GLOB, and -j VAL_GLOB if it had one",
                                       "--mqar-gen zoology"};
    if (st->data_kind != ds->kind) {
        fail(EXIT_USAGE, "%s was written by a run training on %s, but this run trains on %s\n  hint: resume with the "
             "data flags of that run (%s)", path, what[st->data_kind], what[ds->kind], how[st->data_kind]);
    }
    if (ds->kind == DATA_TEXT) { dataloader_restore_state(&ds->train, st->data, st->n_data); return; }
    if (ds->kind == DATA_ZOOLOGY) {
        uint64_t w[ZOOLOGY_STATE_WORDS];
        data_zoology_words(ds, w);
        if (st->n_data != ZOOLOGY_STATE_WORDS) { fail(EXIT_BADFILE, "%s: the data position is not Zoology's MQAR's", path); }
        if (memcmp(w + 1, st->data + 1, (ZOOLOGY_STATE_WORDS - 1) * sizeof(uint64_t)) != 0) {
            fail(EXIT_USAGE, "%s was written with other Zoology MQAR data (seeds, set sizes, vocab, pairs or power_a)\n  "
                 "hint: resume with that run's --mqar-data-seed, --mqar-train, --mqar-test, --mqar-vocab, --mqar-pairs and "
                 "--mqar-power-a", path);
        }
        ds->zpos = (long)st->data[0];
        return;
    }
    if (st->n_data != 4) { fail(EXIT_BADFILE, "%s: the data position is not an MQAR stream's", path); }
    for (int i = 0; i < 4; i++) { ds->rng.s[i] = st->data[i]; }
}

// starts an evaluation; returns how many held-out batches data_val_next then gives (0: none)
static long data_val_begin(DataSource* ds) {
    if (ds->kind == DATA_TEXT) {
        if (ds->has_val) { dataloader_reset(&ds->val); }
        return ds->has_val ? ds->val_batches : 0;
    }
    if (ds->kind == DATA_ZOOLOGY) { ds->vpos = 0; return (ds->n_test + ds->B - 1) / ds->B; } // the last one short
    rng_seed(&ds->val_rng, ds->seed ^ 0x5EED0F7E57DA7AULL);
    return ds->val_batches;
}

static void data_val_next(DataSource* ds, int* x, int* y) {
    if (ds->kind == DATA_TEXT) { data_loader_batch(ds, &ds->val, x, y); return; }
    if (ds->kind == DATA_ZOOLOGY) { mqar_zoology_batch(&ds->mq, ds->test_seed, ds->n_test, ds->vpos++ * ds->B, ds->B, x, y); return; }
    mqar_batch(&ds->mq, &ds->val_rng, ds->B, x, y);
}

// the data and the tokenizer must fit the model (MQAR: check_task). A tokenizer larger than the model's vocabulary
// is refused here rather than by the loader at the first out-of-range id, maybe hours into the run.
static void data_check_task(const DataSource* ds, const Tokenizer* tok, const PdnConfig* mc) {
    if (ds->kind != DATA_TEXT) { check_task(&ds->mq, ds->kind == DATA_ZOOLOGY, mc); return; }
    if (tok && tok->vocab_size > mc->vocab_size) {
        fail(EXIT_USAGE, "the tokenizer has %d tokens, more than the model's vocabulary of %d\n  hint: set --vocab %d, or "
             "give the tokenizer the shards were made with", tok->vocab_size, mc->vocab_size, tok->vocab_size);
    }
    warn_eigen_bound(mc);
}

// the line before training: what the data is
static void data_describe(const DataSource* ds, int vocab_size) {
    if (ds->kind == DATA_MQAR) {
        printf("MQAR: vocab %d, length %d, %d pairs; chance accuracy ~%.1f%%\n", ds->mq.vocab, ds->mq.seq_len, ds->mq.pairs,
               100.0 / (ds->mq.vocab / 2));
        return;
    }
    if (ds->kind == DATA_ZOOLOGY) {
        printf("MQAR (Zoology's generator): vocab %d, length %d, %d pairs, power_a %g; train set %ld examples (seed %llu, "
               "%ld batches an epoch, one order), test set %ld (seed %llu); chance accuracy ~%.2f%%\n", ds->mq.vocab,
               ds->mq.seq_len, ds->mq.pairs, ds->mq.power_a, ds->n_train, (unsigned long long)ds->train_seed,
               (ds->n_train + ds->B - 1) / ds->B, ds->n_test, (unsigned long long)ds->test_seed, 100.0 / (ds->mq.vocab / 2));
        return;
    }
    printf("text: train %llu tokens in %d shard%s (%llu windows of %d x %d, shuffled by --seed); vocab %d (%s)\n",
           (unsigned long long)ds->train.total_tokens, ds->train.n_shards, ds->train.n_shards == 1 ? "" : "s",
           (unsigned long long)ds->train.total_windows, ds->B, ds->T, vocab_size, ds->vocab_from);
    if (ds->has_val) {
        printf("val: %llu tokens in %d shard%s; %ld batches per evaluation\n", (unsigned long long)ds->val.total_tokens,
               ds->val.n_shards, ds->val.n_shards == 1 ? "" : "s", ds->val_batches);
    } else {
        printf("no validation data (no -j, or -m 0): no val loss will be reported\n");
    }
    if (ds->doc_eot >= 0) {
        printf("packed documents (--doc-mask 1): a document starts after every end-of-text token (id %d) and at every "
               "row; the recurrent state, the preconditioner and the short convolution start afresh there\n", ds->doc_eot);
    }
}

// ----------------------------------------------------------------------------------------------------
// tokens and text: --tokenizer, --prompt, decoded output

// --tokenizer: loaded into *t (returned), or NULL when not given
static Tokenizer* load_tokenizer_flag(const TrainConfig* tc, Tokenizer* t) {
    if (!tc->tokenizer[0]) { return NULL; }
    tokenizer_load(t, tc->tokenizer);
    return t;
}

// --prompt as token ids. The rule: with --tokenizer the prompt is text, encoded after an <|endoftext|> (every
// training document follows one, so the model continues the prompt as the start of a document; an empty prompt is
// the <|endoftext|> alone); without a tokenizer it is token ids separated by spaces or commas. Ids must lie in the
// model's vocabulary. Returns the number of tokens (>= 1).
static int prompt_tokens(const TrainConfig* tc, Tokenizer* tok, int vocab_size, int* out, int max) {
    int n = 0;
    if (tok) {
        TokenBuf tb;
        memset(&tb, 0, sizeof tb);
        if (tok->eot_id >= 0) { tokbuf_push(&tb, tok->eot_id); }
        if (tc->prompt[0]) {
            tokenizer_check_can_encode(tok);
            tokenizer_encode(tok, tc->prompt, strlen(tc->prompt), &tb);
        }
        if (tb.n > (size_t)max) { fail(EXIT_USAGE, "--prompt has more than %d tokens", max); }
        for (size_t i = 0; i < tb.n; i++) { out[i] = tb.ids[i]; }
        n = (int)tb.n;
        tokbuf_free(&tb);
    } else {
        n = parse_prompt(tc->prompt, out, max, vocab_size);
    }
    if (n == 0) { fail(EXIT_USAGE, "--generate needs a --prompt: token ids, or text with --tokenizer"); }
    for (int i = 0; i < n; i++) {
        if (out[i] < 0 || out[i] >= vocab_size) {
            fail(EXIT_USAGE, "--prompt token %d is outside the model's vocabulary [0, %d)", out[i], vocab_size);
        }
    }
    return n;
}

// tokens as (escaped) text with a tokenizer, else as ids; then a newline
static void print_tokens(FILE* f, const Tokenizer* tok, const int* ids, int n) {
    if (!tok) {
        for (int i = 0; i < n; i++) { fprintf(f, "%d%s", ids[i], i + 1 < n ? " " : ""); }
        fputc('\n', f);
        return;
    }
    ByteBuf bb;
    memset(&bb, 0, sizeof bb);
    size_t bad = tokenizer_decode(tok, ids, (size_t)n, &bb);
    print_text_escaped(f, bb.b, bb.n);
    if (bad) { fprintf(f, "[%zu ids outside the tokenizer's vocabulary left out]", bad); }
    fputc('\n', f);
    bytebuf_free(&bb);
}

// --doc-mask 1 on text: the end-of-text id (--eot-id, else the tokenizer's) and the loaders' documents, before a
// resume checks the state file's doc_mask line against it
static void data_docs_setup(DataSource* ds, const TrainConfig* tc, const Tokenizer* tok, const PdnConfig* mc) {
    if (!tc->doc_mask || ds->kind != DATA_TEXT) { return; }
    int eot = tc->eot_id >= 0 ? tc->eot_id : tok ? tok->eot_id : -1;
    if (eot < 0) {
        fail(EXIT_USAGE, "--doc-mask 1 needs the end-of-text id that separates the documents\n  hint: --eot-id N (GPT-2's "
             "is 50256), or --tokenizer with an <|endoftext|> token");
    }
    if (eot >= mc->vocab_size) { fail(EXIT_USAGE, "--eot-id %d is outside the model's vocabulary (%d tokens)", eot, mc->vocab_size); }
    if (layerset_count(&mc->attn_layers)) {
        fail(EXIT_USAGE, "--doc-mask 1 with attention layers is not supported: the attention would need per-document "
             "masks and positions\n  hint: --doc-mask 0, or a model without --attn-layers");
    }
    data_docs_on(ds, eot);
}

// The start of both trainers' main(): the model's source (-y / -e / flags), the tokenizer, the data source (which
// fills a vocabulary the preset left at 0), then the config check. Returns the tokenizer or NULL.
static Tokenizer* run_setup(TrainConfig* tc, PdnConfig* mc, real** loaded, uint32_t* crc, char* resume_state, size_t n,
                            Tokenizer* tok_mem, DataSource* ds, int rank, int world) {
    // the box's "preset" line says where the model came from when a checkpoint gave it (and no --preset agreed with it)
    if (load_model_source(tc, mc, loaded, crc, resume_state, n) && !tc->preset_given) { strcpy(tc->preset, "the checkpoint's"); }
    Tokenizer* tok = load_tokenizer_flag(tc, tok_mem);
    memset(ds, 0, sizeof(*ds));
    if (!tc->generate && !tc->eval[0]) { data_init(ds, tc, tok ? tok->vocab_size : 0, &mc->vocab_size, rank, world); }
    const char* err = pdn_config_check(mc);
    if (err) { fail(EXIT_USAGE, "%s", err); }
    data_docs_setup(ds, tc, tok, mc);
    return tok;
}

// the evaluation line and its log twin; *final_val keeps the last text val loss (for the closing line)
static void report_eval(Logger* lg, const DataSource* ds, long step, double vl, double va, long nb, int B, long N, double* final_val) {
    if (ds->kind != DATA_TEXT) { // Zoology's: the whole test set, the last batch's padding rows left out
        printf("val | step %ld | loss %.6f | recall accuracy %.2f%% (%ld held-out sequences)\n", step, vl, 100 * va,
               ds->kind == DATA_ZOOLOGY ? ds->n_test : nb * B);
        logger_printf(lg, "s:%ld vl:%.6f vacc:%.4f\n", step, vl, va);
    } else if (nb) {
        printf("val | step %ld | loss %.6f (%ld batches, %ld tokens)\n", step, vl, nb, nb * N);
        logger_printf(lg, "s:%ld vl:%.6f\n", step, vl);
        *final_val = vl;
    }
}

// --generate's output: with a tokenizer the prompt as given (without the <|endoftext|> put before it) and its
// continuation, as text; without one the generated token ids. ids = prompt (P) followed by the n generated tokens.
static void print_generation(const Tokenizer* tok, const int* ids, int P, int n) {
    if (tok) {
        int skip = ids[0] == tok->eot_id;
        print_tokens(stdout, tok, ids + skip, P - skip + n);
    } else {
        print_tokens(stdout, NULL, ids + P, n);
    }
}

// ----------------------------------------------------------------------------------------------------
// the run, once for both trainers: --generate, resume, --debug-state, the training loop (the step, the schedule of
// evaluations, samples and checkpoints) and what a checkpoint holds. What differs between the CPU reference and the
// CUDA trainer is behind the tr_* calls declared here, which each trainer defines for its `struct Trainer` (its model,
// activations and whatever else those calls need). In a multi-GPU job every process runs all of this.

typedef struct Trainer Trainer;
typedef struct GenState GenState;

// A training step. tr_step_begin zeroes the gradients (and starts the step's clock). tr_forward_backward runs one
// micro-batch (B*T tokens x and targets y, -1 where none; doc: the packed documents' starts (--doc-mask 1) or NULL):
// its gradients accumulate, scaled by 1 / (its targets x accum); returns its mean loss; last: the step's last
// micro-batch (the GPU then hands its gradients to the reduce-scatter); logits, if not NULL, receives the (B*T,
// vocab) logits before the softmax. tr_grad_norm: the global gradient norm (*loss in: this process's mean loss, out:
// the mean over every process; *stop in: whether this process was asked to stop, out: whether any was). tr_update: AdamW with the gradients scaled by grad_scale, step 1-based;
// returns 1 if a parameter or moment is no longer finite (on any process). tr_skip: a step whose update is dropped
// (the GPU derives the bf16 parameters of `step` again, as a resume from it would). tr_step_end: the step's time in
// seconds (timed: not a warm-up step).
static void tr_step_begin(Trainer* tr);
static double tr_forward_backward(Trainer* tr, const int* x, const int* y, const int* doc, int accum, int last,
                                  float* logits);
static double tr_grad_norm(Trainer* tr, double* loss, int* stop);
static int tr_update(Trainer* tr, float lr, long step, double grad_scale);
static void tr_skip(Trainer* tr, long step);
static double tr_step_end(Trainer* tr, int timed);
// one held-out batch: the loss summed over its targets, their number and the argmax hits; v[0..n) summed over processes
static double tr_eval_batch(Trainer* tr, const int* x, const int* y, const int* doc, long* count, long* hits);
static void tr_sum(Trainer* tr, double* v, int n);
// What a checkpoint writes: the full parameters and AdamW moments (num_elems each) into host buffers; every process
// calls it (ZeRO-1 gathers them), the buffers are NULL on the processes that do not write. tr_grads: the gradients
// as floats (--debug-state).
static void tr_host_state(Trainer* tr, real* params, real* m, real* v);
static void tr_grads(Trainer* tr, float* out);
// generation: a recurrent state for a prompt of P tokens and total tokens in all (the attention layers' KV cache);
// feed n tokens (the prompt, then one at a time; n = P or 1) and get the last one's logits as vocab floats in row
static GenState* tr_gen_open(Trainer* tr, int P, int total);
static void tr_gen_feed(GenState* g, const int* tokens, int n, float* row);
static void tr_gen_close(GenState* g);
// evaluation: one forward pass over B rows of T tokens, each from a zero state (no gradients); lp[n] = log p(y[n])
// under the model's softmax at position n (0 where y[n] < 0). The trainer keeps the activations of the last shape.
static void tr_logprobs(Trainer* tr, int B, int T, const int* x, const int* y, float* lp);
// a multi-GPU job's watchdog: the phase that starts now may take up to --dist-timeout (nothing on the CPU)
static void tr_watch(Trainer* tr, const char* phase);

// what the shared code needs to know about the run (main fills the first part)
typedef struct {
    TrainConfig* tc;
    const PdnConfig* mc;
    const PdnLayout* lay;
    DataSource* ds;
    Tokenizer* tok;                      // NULL without --tokenizer
    int rank, world;                     // this process, and how many train together (1 on the CPU)
    const char* precision;               // what --debug-state says made it: "cpu-f32", "cuda-bf16", ...
    double flops_per_token, peak_flops;  // for the MFU column (peak_flops of all processes; <= 0: not printed)
    long start_step;                     // 0, or the step a resume continues from
    int sample_start;                    // -s: the token samples start from (<|endoftext|>), else -1 (run_check)
    // filled by run_train
    Logger lg;
    long last_saved;                     // the step of the newest checkpoint this run wrote, -1 if none
    long steps_done;
    int timed;                           // steps timed (all but the first of this process)
    double seconds, t_steps, final_val;  // wall time of the loop, summed time of the timed steps, last val loss (-1)
} Run;

static void run_init(Run* r, TrainConfig* tc, const PdnConfig* mc, const PdnLayout* lay, DataSource* ds, Tokenizer* tok,
                     int rank, int world, const char* precision) {
    memset(r, 0, sizeof(*r));
    r->tc = tc; r->mc = mc; r->lay = lay; r->ds = ds; r->tok = tok; r->rank = rank; r->world = world;
    r->precision = precision;
    r->peak_flops = -1.0;
    r->sample_start = -1;
    r->final_val = -1.0;
    r->last_saved = -1;
}

// -y 1: read the state file into m and v (the AdamW moments, num_elems of dtype), check that it belongs to the loaded
// checkpoint and to these batch settings, and continue the data source from its position (refused from another data
// source). Returns the step to continue from.
static long resume_state_read(const char* path, const TrainConfig* tc, int nproc, uint32_t model_crc, DataSource* ds,
                              void* m, void* v, size_t num_elems, const char* dtype) {
    TrainState st;
    state_read(path, &st, m, v, num_elems, dtype);
    if (st.model_crc != model_crc) {
        fail(EXIT_BADFILE, "%s belongs to a different checkpoint (model crc %08x, found %08x)", path, st.model_crc, model_crc);
    }
    // the data order continues exactly when every step takes the same micro-batches: same -b, -t and micro-batches per
    // step (accumulation steps x processes). The number of processes itself may change: N processes resume on M.
    if (st.B != tc->B || st.T != tc->T || (long)st.grad_accum * st.nproc != (long)tc->grad_accum * nproc) {
        fail(EXIT_USAGE, "resume needs the same batch settings: the checkpoint used -b %d -t %d with %d accumulation "
             "steps on %d process(es); now -b %d -t %d, %d steps on %d\n  hint: keep -b, -t and -d (tokens per step); the "
             "number of processes may change", st.B, st.T, st.grad_accum, st.nproc, tc->B, tc->T, tc->grad_accum, nproc);
    }
    if (st.doc_eot != ds->doc_eot) {
        fail(EXIT_USAGE, "%s was written by a run with %s, this run has %s\n  hint: resume with that run's --doc-mask "
             "and --eot-id (a model trained on packed documents reads them one way)", path,
             st.doc_eot < 0 ? "--doc-mask 0" : "--doc-mask 1", ds->doc_eot < 0 ? "--doc-mask 0" : "--doc-mask 1");
    }
    // -x counts every step from the start: below the checkpoint's step there is nothing to train
    if (st.step > tc->steps) {
        fail(EXIT_USAGE, "-x %d (total steps, counted from the start) is below the step this run resumes from: %s is at "
             "step %ld\n  hint: -x %ld or more continues it; to train a new model, use another -o", tc->steps, path, st.step,
             st.step + 1);
    }
    data_restore(ds, &st, path);
    return st.step;
}

// the data and the tokenizer must fit the model; -s samples start as a document does in the shards: after an
// <|endoftext|> (r->sample_start)
static void run_check(Run* r) {
    data_check_task(r->ds, r->tok, r->mc);
    r->sample_start = r->tc->sample_every ? r->tok->eot_id : -1;
    if (r->tc->sample_every && r->sample_start < 0) {
        fail(EXIT_USAGE, "-s: the tokenizer has no <|endoftext|> token to start samples from");
    }
}

// n tokens sampled after a prompt of P >= 1 tokens into out: the prompt goes through the model once (chunked), then
// each new token advances the recurrent state by one step. Generation has its own state and RNG, so a sample taken
// during training leaves the training exactly as it was.
static void generate_tokens(Trainer* tr, int vocab, const int* prompt, int P, int n, float temperature, int top_k,
                            uint64_t seed, int* out) {
    GenState* g = tr_gen_open(tr, P, P + n);
    Rng rng;
    rng_seed(&rng, seed);
    float* row = (float*)mallocCheck((size_t)vocab * sizeof(float));
    tr_gen_feed(g, prompt, P, row);
    for (int i = 0; i < n; i++) {
        out[i] = sample_logits(row, vocab, temperature, top_k, &rng);
        if (i + 1 < n) { tr_gen_feed(g, &out[i], 1, row); }
    }
    free(row);
    tr_gen_close(g);
}

// --generate N: the prompt (text with --tokenizer, else token ids) and its continuation on stdout, the time on stderr
static void run_generate(Trainer* tr, const Run* r) {
    const TrainConfig* tc = r->tc;
    int* ids = (int*)mallocCheck((65536 + (size_t)tc->generate) * sizeof(int));
    int P = prompt_tokens(tc, r->tok, r->mc->vocab_size, ids, 65536);
    double t0 = wall_seconds();
    generate_tokens(tr, r->mc->vocab_size, ids, P, tc->generate, tc->temperature, tc->top_k, (uint64_t)tc->seed, ids + P);
    double dt = wall_seconds() - t0;
    print_generation(r->tok, ids, P, tc->generate);
    fprintf(stderr, "generated %d tokens after a %d-token prompt in %.1f ms\n", tc->generate, P, dt * 1e3);
    free(ids);
}

// -s: a sample of -g tokens from <|endoftext|> (the start of a document), decoded
static void run_sample(Trainer* tr, const Run* r, long step) {
    const TrainConfig* tc = r->tc;
    int* out = (int*)mallocCheck((size_t)tc->gen_tokens * sizeof(int));
    int start = r->sample_start;
    generate_tokens(tr, r->mc->vocab_size, &start, 1, tc->gen_tokens, tc->temperature, tc->top_k, (uint64_t)tc->seed, out);
    printf("sample | step %ld | %d tokens after <|endoftext|>:\n", step, tc->gen_tokens);
    print_tokens(stdout, r->tok, out, tc->gen_tokens);
    printf("---\n");
    free(out);
}

// Held-out loss over the data source's evaluation batches (the same ones at every evaluation, on either trainer:
// MQAR's fixed stream, the start of the text validation split) and the accuracy of the argmax over the whole
// vocabulary at the positions with a target (for MQAR: recall accuracy). x, y: scratch of B*T ints. With several
// processes each evaluates its slice of a text split and the sums are combined; MQAR's batches are the same on every
// process. Returns the number of batches (0: none).
static long run_evaluate(Trainer* tr, const Run* r, int* x, int* y, double* loss, double* acc) {
    long batches = data_val_begin(r->ds);
    double v[3] = {0.0, 0.0, 0.0}; // the loss summed over the targets, the targets, the hits
    for (long bi = 0; bi < batches; bi++) {
        data_val_next(r->ds, x, y);
        long count, hits;
        v[0] += tr_eval_batch(tr, x, y, r->ds->doc, &count, &hits);
        v[1] += (double)count;
        v[2] += (double)hits;
    }
    if (r->world > 1 && r->ds->kind == DATA_TEXT) {
        tr_sum(tr, v, 3);
        batches *= r->world;
    }
    // MQAR: Zoology averages each example's accuracy over the examples; every example has exactly `pairs` targets
    // (padding rows none), so that mean is this ratio
    *loss = v[1] > 0 ? v[0] / v[1] : 0.0;
    *acc = v[1] > 0 ? v[2] / v[1] : 0.0;
    return batches;
}

// The checkpoint pair of `step`, written as one: both files to their temporaries, then both renamed. When a write fails
// both temporaries are removed and the message names the file: the previous pair stays the newest. (A crash between
// the two renames leaves a model file without its state, which a resume ignores.)
static void checkpoint_pair_write(const char* mp, const char* sp, const PdnConfig* mc, const PdnLayout* lay,
                                  const real* params, const real* m, const real* v, TrainState* st) {
    size_t n = lay->num_elems;
    TextBuf tm, ts;
    memset(&tm, 0, sizeof tm);
    memset(&ts, 0, sizeof ts);
    pdn_checkpoint_header(&tm, mc, lay, REAL_DTYPE, st->step);
    const void* mb[1] = {params};
    size_t mn[1] = {n * sizeof(real)};
    size_t mh, sh;
    st->model_crc = headed_finish(&tm, mb, mn, 1, &mh);
    state_header(&ts, st, n, REAL_DTYPE);
    const void* sb[2] = {m, v};
    size_t sn[2] = {n * sizeof(real), n * sizeof(real)};
    headed_finish(&ts, sb, sn, 2, &sh);
    AtomicFile am, as;
    int err = headed_write_tmp(&am, mp, &tm, mh, mb, mn, 1);
    if (err) { atomic_fail(&am, err); }
    err = headed_write_tmp(&as, sp, &ts, sh, sb, sn, 2);
    if (err) { atomic_discard(&am); atomic_fail(&as, err); }
    err = atomic_try_rename(&am);
    if (err) { atomic_discard(&as); atomic_fail(&am, err); }
    err = atomic_try_rename(&as);
    if (err) { unlink(mp); atomic_fail(&as, err); }
    free(tm.s);
    free(ts.s);
}

// the checkpoint of `step`: the parameters (model_*.bin) and the training state (state_*.bin: the AdamW moments, the
// step, the batch settings and the data position). Nothing that is not finite is ever written: the step's checks make
// that so, and this is the last guard. Then --keep-last removes the older pairs.
static void run_save(Trainer* tr, Run* r, long step) {
    size_t n = r->lay->num_elems;
    real* buf = r->rank == 0 ? (real*)mallocCheck(3 * n * sizeof(real)) : NULL;
    tr_host_state(tr, buf, buf ? buf + n : NULL, buf ? buf + 2 * n : NULL);
    if (!buf) { r->last_saved = step; return; }
    static const char* const what[3] = {"parameter", "AdamW moment m of", "AdamW moment v of"};
    for (int k = 0; k < 3; k++) {
        const char* tname;
        long bad = pdn_find_nonfinite(r->lay, buf + k * n, &tname);
        if (bad >= 0) {
            fail(EXIT_NUMERIC, "step %ld: %s %s (flat element %ld) is %g: no checkpoint is written with values that are "
                 "not finite", step, what[k], tname ? tname : "(padding)", bad, (double)buf[k * n + bad]);
        }
    }
    const TrainConfig* tc = r->tc;
    char mp[1100], sp[1100];
    ckpt_paths(tc->out_dir, step, mp, sp, sizeof mp);
    TrainState st;
    memset(&st, 0, sizeof st);
    st.step = step; st.B = tc->B; st.T = tc->T; st.grad_accum = tc->grad_accum; st.nproc = r->world;
    st.doc_eot = r->ds->doc_eot;
    data_save(r->ds, &st);
    checkpoint_pair_write(mp, sp, r->mc, r->lay, buf, buf + n, buf + 2 * n, &st);
    printf("saved checkpoint %s (+ %s)\n", mp, sp);
    free(buf);
    r->last_saved = step;
    prune_checkpoints(tc->out_dir, step, tc->keep_last);
}

// --debug-state FILE: forward, loss and backward of one micro-batch (the first of this run's data stream), written
// with its logits (before the softmax) and every parameter gradient, for test_pdn --compare
static void run_debug_state(Trainer* tr, const Run* r) {
    const TrainConfig* tc = r->tc;
    size_t N = (size_t)tc->B * tc->T, Vv = (size_t)r->mc->vocab_size;
    DebugState d;
    memset(&d, 0, sizeof d);
    d.cfg = *r->mc; d.lay = *r->lay; d.B = tc->B; d.T = tc->T;
    snprintf(d.precision, sizeof d.precision, "%s", r->precision);
    d.x = (int*)mallocCheck(N * sizeof(int));
    d.y = (int*)mallocCheck(N * sizeof(int));
    d.logits = (float*)mallocCheck(N * Vv * sizeof(float));
    d.grads = (float*)mallocCheck(r->lay->num_elems * sizeof(float));
    data_next(r->ds, d.x, d.y);
    tr_step_begin(tr);
    d.loss = tr_forward_backward(tr, d.x, d.y, r->ds->doc, 1, 1, d.logits);
    tr_grads(tr, d.grads);
    debug_state_write(tc->debug_state, &d);
    printf("wrote %s: B %d, T %d, loss %.9f, %zu gradient elements\n", tc->debug_state, d.B, d.T, d.loss, r->lay->num_elems);
    free(d.x); free(d.y); free(d.logits); free(d.grads);
}

// Stopping on a signal (preemption, Ctrl-C): the first SIGINT, SIGTERM or SIGUSR1 asks the run to stop. It finishes
// the step it is in, writes a checkpoint (with -o) and exits with EXIT_STOPPED; -y 1 then continues exactly. A
// second signal ends the process at once (killed by it; the checkpoint files already written are whole, since every
// write is atomic).
static volatile sig_atomic_t stop_signal = 0;

static void stop_handler(int sig) {
    if (stop_signal) {
        static const char msg[] = "\nsecond signal: stopping now, without a checkpoint of this step\n";
        ssize_t w = write(2, msg, sizeof msg - 1);
        (void)w;
        signal(sig, SIG_DFL);
        raise(sig); // delivered when the handler returns: the process ends as killed by sig
        return;
    }
    stop_signal = sig;
    static const char msg[] = "\nsignal received: finishing this step, then writing a checkpoint and exiting "
                              "(a second signal stops at once)\n";
    ssize_t w = write(2, msg, sizeof msg - 1);
    (void)w;
}

static const char* signal_name(int sig) {
    return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : sig == SIGUSR1 ? "SIGUSR1" : "a signal";
}

static void stop_on_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = stop_handler;
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGINT); // one handler at a time: a second signal waits for the first to be noted
    sigaddset(&sa.sa_mask, SIGTERM);
    sigaddset(&sa.sa_mask, SIGUSR1);
    sa.sa_flags = SA_RESTART;       // reads and writes go on
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
}

// Training from r->start_step to -x: per step the micro-batches, the checks (a loss or gradient norm that is not
// finite stops the run or, with --skip-nonfinite, drops the step's update; an update that makes a parameter or a moment
// non-finite stops it), the clipped AdamW update and the step line, then on their schedules the evaluation (-v, and at
// the end), a sample (-s) and a checkpoint (-n, and at the end, with -o); a signal stops it after the step (above).
// MQAR with --mqar-stop-acc: an evaluation above it ends the run there (Zoology's early stopping), as a last step does.
// Returns the exit code: 0, or EXIT_STOPPED.
static int run_train(Trainer* tr, Run* r) {
    TrainConfig* tc = r->tc;
    DataSource* ds = r->ds;
    size_t N = (size_t)tc->B * tc->T;
    int* x = (int*)mallocCheck(N * sizeof(int));
    int* y = (int*)mallocCheck(N * sizeof(int));
    if (tc->out_dir[0] && r->rank == 0) { ensure_dir(tc->out_dir); }
    logger_init(&r->lg, r->rank == 0 ? tc->out_dir : "", r->start_step); // rank 0 writes the log and the checkpoints
    data_describe(ds, r->mc->vocab_size);
    stop_on_signals();
    StepTimes recent;
    memset(&recent, 0, sizeof recent);
    double t_start = wall_seconds();
    int rc = 0, skipped = 0; // skipped: non-finite steps in a row
    r->steps_done = 0; r->timed = 0; r->t_steps = 0.0; r->final_val = -1.0;
    for (long step = r->start_step; step < tc->steps; step++) {
        tr_watch(tr, "a training step");
        tr_step_begin(tr);
        double loss = 0.0;
        for (int micro = 0; micro < tc->grad_accum; micro++) {
            data_next(ds, x, y);
            // each micro-batch's loss is scaled so that the summed gradients are the mean over every process's
            loss += tr_forward_backward(tr, x, y, ds->doc, tc->grad_accum * r->world, micro == tc->grad_accum - 1, NULL) /
                    tc->grad_accum;
        }
        int stop = stop_signal != 0;
        double norm = tr_grad_norm(tr, &loss, &stop); // loss: now the mean over the processes
        float lr = lr_at(tc, (int)step);
        int finite = isfinite(loss) && isfinite(norm); // (a NaN norm is not > --grad-clip: it must be caught here)
        if (!finite && skipped >= tc->skip_nonfinite) {
            char last[64] = "no checkpoint was written by this run";
            if (r->last_saved >= 0) { snprintf(last, sizeof last, "the newest checkpoint is step %ld's", r->last_saved); }
            fail(EXIT_NUMERIC, "step %ld: loss %g, gradient norm %g: not finite, training diverged (nothing was written for "
                 "this step; %s)\n  hint: lower -l (learning rate), raise -u (warm-up), keep --grad-clip on, or let "
                 "--skip-nonfinite N drop up to N such steps in a row", step + 1, loss, norm, last);
        }
        if (finite) {
            double scale = (tc->grad_clip > 0 && norm > tc->grad_clip) ? tc->grad_clip / norm : 1.0;
            if (tr_update(tr, lr, step + 1, scale)) {
                fail(EXIT_NUMERIC, "step %ld: the update made a parameter or an AdamW moment non-finite (loss %g and gradient "
                     "norm %g were finite): stopping; nothing was written for this step\n  hint: keep --grad-clip on (now "
                     "%g) and lower -l", step + 1, loss, norm, tc->grad_clip);
            }
            skipped = 0;
        } else {
            tr_skip(tr, step + 1);
            skipped++;
        }
        double dt = tr_step_end(tr, step > r->start_step);
        r->steps_done++;
        if (step > r->start_step) { r->t_steps += dt; r->timed++; step_times_add(&recent, dt); }
        double mfu = r->peak_flops > 0 ? r->flops_per_token * tc->total_batch / dt / r->peak_flops : -1.0;
        print_step(&r->lg, tc, step, loss, norm, lr, dt, recent.n ? step_times_mean(&recent) : dt, mfu);
        if (!finite) {
            printf("step %ld skipped: its loss or gradient norm is not finite, its update was dropped (%d in a row; "
                   "--skip-nonfinite %d)\n", step + 1, skipped, tc->skip_nonfinite);
            logger_printf(&r->lg, "s:%ld skipped:%d\n", step + 1, skipped);
        }
        int last = step + 1 == tc->steps, saved = 0;
        if ((tc->val_every && (step + 1) % tc->val_every == 0) || last) {
            tr_watch(tr, "the evaluation");
            double vl, va;
            long nb = run_evaluate(tr, r, x, y, &vl, &va);
            report_eval(&r->lg, ds, step + 1, vl, va, nb, tc->B, (long)N, &r->final_val);
            if (ds->kind != DATA_TEXT && tc->mqar_stop_acc > 0 && va > tc->mqar_stop_acc && !last) {
                // every process evaluates the same batches with the same parameters: all stop at this step
                printf("early stop at step %ld: recall accuracy %.2f%% > %.2f%% (--mqar-stop-acc)\n", step + 1, 100 * va,
                       100.0 * tc->mqar_stop_acc);
                logger_printf(&r->lg, "s:%ld early_stop vacc:%.4f\n", step + 1, va);
                last = 1;
            }
        }
        if (r->sample_start >= 0 && tc->gen_tokens > 0 && r->rank == 0 && ((step + 1) % tc->sample_every == 0 || last)) {
            run_sample(tr, r, step + 1);
        }
        if (tc->out_dir[0] && ((tc->ckpt_every && (step + 1) % tc->ckpt_every == 0) || last || stop)) {
            tr_watch(tr, "saving a checkpoint");
            run_save(tr, r, step + 1);
            saved = 1;
        }
        if (stop && !last) {
            printf("stopped by %s after step %ld of %d: %s\n", stop_signal ? signal_name(stop_signal) : "another process's signal",
                   step + 1, tc->steps, saved ? "its checkpoint is written; -y 1 with the same flags continues the run" :
                   "nothing was saved (no -o)");
            rc = EXIT_STOPPED;
            break;
        }
        if (last) { break; }
    }
    r->seconds = wall_seconds() - t_start;
    free(x);
    free(y);
    return rc;
}

// the closing line: steps, time, what the trainer adds (extra, may be ""), the last text val loss
static void print_done(const Run* r, const char* extra) {
    printf("done: %ld steps in %.1f s%s", r->steps_done, r->seconds, extra);
    if (r->final_val >= 0) { printf("; final val loss %.6f", r->final_val); }
    printf("\n");
}

// --export-hf / --import-hf (hf.h): both trainers run them before anything else and exit; no GPU is touched.
// Returns 1 if one ran.
static int hf_command(const TrainConfig* tc) {
    if (tc->export_hf[0]) {
        PdnConfig c;
        PdnLayout lay;
        real* params;
        long step = pdn_checkpoint_read(tc->init_ckpt, &c, &lay, &params, NULL);
        Tokenizer tok_mem;
        Tokenizer* tok = load_tokenizer_flag(tc, &tok_mem);
        int bf16 = strcmp(tc->export_dtype, "bf16") == 0, cls, rows;
        int n = hf_export(tc->export_hf, &c, params, bf16, tok, &cls, &rows);
        char vname[64];
        pdn_variant_name(&c, vname, sizeof vname);
        printf("exported %s (%s, step %ld) as %s (%s): %d tensors, %s, into %s\n", vname, tc->init_ckpt, step,
               HF_MODEL_TYPE[cls], HF_ARCH[cls], n, bf16 ? "BF16" : "F32", tc->export_hf);
        if (rows < c.vocab_size) { printf("  kept the tokenizer's %d vocabulary rows of %d (the rest are padding)\n", rows, c.vocab_size); }
        if (!tok) { printf("  no --tokenizer: no tokenizer files written (lm-eval needs them)\n"); }
        free(params);
        if (tok) { tokenizer_free(tok); }
        return 1;
    }
    if (tc->import_hf[0]) {
        PdnConfig c;
        PdnLayout lay;
        float* params;
        int ignored;
        hf_import(tc->import_hf, &c, &params, &ignored);
        if (ignored) { printf("import: lm_head.weight ignored: tie_word_embeddings is true (the embedding is the classifier)\n"); }
        pdn_build_layout(&c, &lay);
        ensure_dir(tc->out_dir);
        char path[1100], vname[64];
        snprintf(path, sizeof path, "%s/model_%08d.bin", tc->out_dir, 0);
        pdn_checkpoint_write(path, &c, &lay, params, "f32", 0);
        pdn_variant_name(&c, vname, sizeof vname);
        printf("imported %s (%s, %zu parameters, vocab %d) into %s\n  continue training with: -e %s\n", tc->import_hf, vname,
               lay.num_params, c.vocab_size, path, path);
        free(params);
        return 1;
    }
    return 0;
}

#include "eval.h"

#endif // PDN_TRAIN_COMMON_H
