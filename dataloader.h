/*
dataloader.h: serves training and validation batches from token shards (shard.h: llm.c's format, uint16 or
uint32 tokens, any size: 64-bit offsets through pread).

A batch is a window of B*T+1 consecutive tokens of one shard: inputs x = window[0 .. B*T), targets
y = window[1 .. B*T] (the next tokens), as ints. Windows start every B*T tokens from a shard's first token
(llm.c's layout); the last B*T tokens or fewer of a shard that do not fill a window are not used, and a shard
shorter than one window is skipped with a warning (an error if no shard holds a window).

The data stream: an epoch is every window once. Its order is the shards in sorted-name order and the windows in
file order, or with shuffling a permutation of the shards and, inside each shard, of its windows, drawn from
Rng streams seeded by (seed, epoch) and (seed, epoch, shard): nothing random is stored, so any position can be
re-derived. Epochs follow each other; the stream is the same whatever the number of processes.

Processes: process `rank` of `world` takes the stream's windows rank, rank + world, rank + 2*world, ... so
every window of an epoch goes to exactly one process, all processes take one window per call in lockstep, and
a step's `world` windows are consecutive in the stream (they may straddle an epoch boundary).

The position is one number, the windows consumed by all processes together, so the saved state is a few words
(dataloader_save_state: 9 uint64, with a fingerprint of the settings and the data), the same on every rank; a
restore continues the exact stream, also with a different number of processes if the position divides evenly.

Validation mode (dataloader_init_val): no shuffling, always from the start of the split: max_batches batches
per process (or -1: the whole split, floor(windows / world) batches per process, so every process runs the same
number), then dataloader_reset() before the next evaluation (reading past the end starts over).

Every token served is checked against the model's vocabulary; a bad id fails with the file, the token
position and the id (exit code 2), as do a bad magic, version or file size (see shard.h).

API:
  void dataloader_init(DataLoader* dl, const char* pattern, int B, int T, int rank, int world, int vocab_size,
                       int shuffle, uint64_t seed);          // pattern: a glob of shard files (sorted)
  void dataloader_init_val(DataLoader* dl, const char* pattern, int B, int T, int rank, int world,
                           int vocab_size, long max_batches);  // max_batches -1: the whole split
  void dataloader_next(DataLoader* dl);                       // fills dl->inputs[B*T], dl->targets[B*T]
  void dataloader_reset(DataLoader* dl);                      // back to the first batch
  long dataloader_num_batches(const DataLoader* dl);          // batches per process per epoch (val: per pass)
  void dataloader_save_state(const DataLoader* dl, uint64_t* words, int* n);        // n <= DATALOADER_STATE_WORDS
  void dataloader_restore_state(DataLoader* dl, const uint64_t* words, int n);
  void dataloader_free(DataLoader* dl);
After dataloader_next, dl->last_epoch, dl->last_shard (index into dl->paths) and dl->last_start (first token of
the window in that shard) tell where the batch came from.

Packed documents: with dl->eot set to the end-of-text id (dataloader_set_eot; -1, the default, means none), every
batch also gets its documents as segments, fla's cu_seqlens over the B*T inputs: dl->seg[0 .. n_seg] are the
increasing positions where a segment starts, seg[0] = 0 and seg[n_seg] = B*T. A segment starts at every row start
(b*T: each of the B rows is a window of its own) and at the token after each end-of-text input inside a row (the
end-of-text token ends its document: llm.c's shards put one before each document). Found once per batch here, on
the inputs as served.
*/
#ifndef PDN_DATALOADER_H
#define PDN_DATALOADER_H

#include <glob.h>
#include "shard.h"

#define DATALOADER_STATE_WORDS 9
#define DATALOADER_STATE_MAGIC 0x50444E444C000001ull   // "PDNDL", version 1

typedef struct {
    // settings
    int B, T, rank, world, vocab_size, shuffle, val;
    uint64_t seed;
    long max_batches;
    // the shards (sorted paths)
    int n_shards;
    char** paths;
    ShardInfo* info;
    uint64_t* n_windows;        // [n_shards]
    uint64_t total_windows;     // in all shards
    uint64_t total_tokens;
    uint64_t epoch_windows;     // windows per epoch: total_windows, or in val mode batches * world
    // position: windows consumed by all processes together before this process's next window
    uint64_t consumed;
    // the current epoch's shard order, its window prefix sums, and the open shard with its window order
    uint64_t cur_epoch;         // UINT64_MAX: none yet
    int* order;                 // [n_shards] shard indices in epoch order
    uint64_t* start;            // [n_shards + 1] first stream window of each position in `order`
    int cur_shard;              // -1: none yet in this epoch
    int fd, fd_shard;           // the open shard file (-1: none)
    uint32_t* perm;             // window order inside the current shard (shuffling only)
    // buffers and outputs
    uint32_t* raw;              // B*T+1 tokens
    int* inputs;                // [B*T]
    int* targets;               // [B*T]
    int eot;                    // end-of-text id for the document segments, -1: none
    int* seg;                   // [B*T+1] segment starts (cu_seqlens), n_seg of them and B*T last
    int n_seg;
    uint64_t last_epoch, last_start;
    int last_shard;
} DataLoader;

static int dl_cmp_str(const void* a, const void* b) { return strcmp(*(char* const*)a, *(char* const*)b); }

// the sorted list of files matching pattern
static void dl_glob(DataLoader* dl, const char* pattern) {
    glob_t g;
    int rc = glob(pattern, 0, NULL, &g);
    if (rc == GLOB_NOMATCH || (rc == 0 && g.gl_pathc == 0)) { fail(EXIT_BADFILE, "no shard files match '%s'", pattern); }
    if (rc != 0) { fail(EXIT_BADFILE, "cannot list shard files '%s' (glob error %d)", pattern, rc); }
    dl->n_shards = (int)g.gl_pathc;
    dl->paths = (char**)mallocCheck(g.gl_pathc * sizeof(char*));
    for (size_t i = 0; i < g.gl_pathc; i++) { dl->paths[i] = strdup(g.gl_pathv[i]); }
    qsort(dl->paths, g.gl_pathc, sizeof(char*), dl_cmp_str);   // byte order, whatever the locale
    globfree(&g);
}

static void dl_common_init(DataLoader* dl, const char* pattern, int B, int T, int rank, int world, int vocab_size) {
    memset(dl, 0, sizeof(*dl));
    if (B < 1 || T < 1) { fail(EXIT_USAGE, "data loader: B and T must be >= 1 (got %d, %d)", B, T); }
    if (world < 1 || rank < 0 || rank >= world) { fail(EXIT_USAGE, "data loader: rank %d of %d processes", rank, world); }
    if (vocab_size < 1) { fail(EXIT_USAGE, "data loader: the vocabulary size must be >= 1"); }
    dl->B = B; dl->T = T; dl->rank = rank; dl->world = world; dl->vocab_size = vocab_size;
    dl->cur_epoch = UINT64_MAX; dl->cur_shard = -1; dl->fd = -1; dl->fd_shard = -1;
    dl_glob(dl, pattern);
    size_t bt = (size_t)B * (size_t)T;
    dl->info = (ShardInfo*)mallocCheck((size_t)dl->n_shards * sizeof(ShardInfo));
    dl->n_windows = (uint64_t*)mallocCheck((size_t)dl->n_shards * sizeof(uint64_t));
    uint64_t largest = 0;
    int small = 0;
    for (int i = 0; i < dl->n_shards; i++) {
        shard_info(dl->paths[i], &dl->info[i]);
        uint64_t c = dl->info[i].count;
        dl->n_windows[i] = c > bt ? (c - 1) / bt : 0;
        dl->total_windows += dl->n_windows[i];
        dl->total_tokens += c;
        if (c > largest) { largest = c; }
        if (dl->n_windows[i] == 0) { small++; }
    }
    if (dl->total_windows == 0) {
        fail(EXIT_BADFILE, "'%s': no shard holds one window of B*T+1 = %zu tokens (the largest has %llu)\n"
             "  hint: lower -b or -t, or make bigger shards", pattern, bt + 1, (unsigned long long)largest);
    }
    if (small) {
        fprintf(stderr, "warning: %d of %d shards matching '%s' hold fewer than B*T+1 = %zu tokens and are skipped\n",
                small, dl->n_shards, pattern, bt + 1);
    }
    dl->order = (int*)mallocCheck((size_t)dl->n_shards * sizeof(int));
    dl->start = (uint64_t*)mallocCheck((size_t)(dl->n_shards + 1) * sizeof(uint64_t));
    dl->raw = (uint32_t*)mallocCheck((bt + 1) * sizeof(uint32_t));
    dl->inputs = (int*)mallocCheck(bt * sizeof(int));
    dl->targets = (int*)mallocCheck(bt * sizeof(int));
    dl->seg = (int*)mallocCheck((bt + 1) * sizeof(int));
    dl->eot = -1;
}

// the end-of-text id that separates documents (segments in every batch), or -1 for none
static void dataloader_set_eot(DataLoader* dl, int eot) { dl->eot = eot; }

// dl->seg, dl->n_seg from the inputs (see the top of the file)
static void dl_segments(DataLoader* dl) {
    int B = dl->B, T = dl->T, n = 0;
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            if (t == 0 || dl->inputs[(size_t)b * T + t - 1] == dl->eot) { dl->seg[n++] = b * T + t; }
        }
    }
    dl->seg[n] = B * T;
    dl->n_seg = n;
}

static void dataloader_init(DataLoader* dl, const char* pattern, int B, int T, int rank, int world, int vocab_size,
                            int shuffle, uint64_t seed) {
    dl_common_init(dl, pattern, B, T, rank, world, vocab_size);
    dl->shuffle = shuffle;
    dl->seed = seed;
    dl->epoch_windows = dl->total_windows;
    if (dl->total_windows < (uint64_t)world) {
        fail(EXIT_BADFILE, "'%s' holds %llu windows of B*T+1 tokens, fewer than the %d processes", pattern,
             (unsigned long long)dl->total_windows, world);
    }
}

static void dataloader_init_val(DataLoader* dl, const char* pattern, int B, int T, int rank, int world, int vocab_size,
                                long max_batches) {
    dl_common_init(dl, pattern, B, T, rank, world, vocab_size);
    dl->val = 1;
    dl->max_batches = max_batches;
    uint64_t per_rank = dl->total_windows / (uint64_t)world;
    if (per_rank == 0) {
        fail(EXIT_BADFILE, "validation data '%s' holds %llu windows of B*T+1 tokens, fewer than the %d processes", pattern,
             (unsigned long long)dl->total_windows, world);
    }
    if (max_batches >= 0 && (uint64_t)max_batches < per_rank) { per_rank = (uint64_t)max_batches; }
    if (per_rank == 0) { fail(EXIT_USAGE, "validation: max_batches must be -1 (all) or >= 1"); }
    dl->epoch_windows = per_rank * (uint64_t)world;
}

static long dataloader_num_batches(const DataLoader* dl) { return (long)(dl->epoch_windows / (uint64_t)dl->world); }

static void dataloader_reset(DataLoader* dl) { dl->consumed = 0; }

// a seed for the Rng of (seed, epoch, shard); shard = -1 for the epoch's shard order
static uint64_t dl_stream_seed(uint64_t seed, uint64_t epoch, int shard) {
    uint64_t x = seed;
    uint64_t h = splitmix64(&x) ^ (epoch * 0x9E3779B97F4A7C15ull);
    x = h;
    return splitmix64(&x) ^ (uint64_t)(int64_t)shard;
}

// Fisher-Yates: a uniformly random permutation of 0..n-1 from the Rng
static void dl_permute_u32(uint32_t* a, uint64_t n, Rng* r) {
    for (uint64_t i = 0; i < n; i++) { a[i] = (uint32_t)i; }
    for (uint64_t i = n; i > 1; i--) {
        uint64_t j = rng_below(r, i);
        uint32_t t = a[i - 1]; a[i - 1] = a[j]; a[j] = t;
    }
}

// the shard order of an epoch and where each shard's windows start in the stream
static void dl_set_epoch(DataLoader* dl, uint64_t epoch) {
    if (epoch == dl->cur_epoch) { return; }
    for (int i = 0; i < dl->n_shards; i++) { dl->order[i] = i; }
    if (dl->shuffle && !dl->val) {
        Rng r;
        rng_seed(&r, dl_stream_seed(dl->seed, epoch, -1));
        for (int i = dl->n_shards; i > 1; i--) {
            int j = (int)rng_below(&r, (uint64_t)i);
            int t = dl->order[i - 1]; dl->order[i - 1] = dl->order[j]; dl->order[j] = t;
        }
    }
    dl->start[0] = 0;
    for (int i = 0; i < dl->n_shards; i++) { dl->start[i + 1] = dl->start[i] + dl->n_windows[dl->order[i]]; }
    dl->cur_epoch = epoch;
    dl->cur_shard = -1;   // the window order inside a shard depends on the epoch too
}

// open shard s of the current epoch (and draw its window order when shuffling)
static void dl_open_shard(DataLoader* dl, int s) {
    if (s == dl->cur_shard) { return; }
    if (dl->fd_shard != s) {
        if (dl->fd >= 0) { close(dl->fd); }
        dl->fd = shard_open_fd(dl->paths[s]);
        dl->fd_shard = s;
        ShardInfo now;
        shard_info_fd(dl->fd, dl->paths[s], &now);   // the file must not have changed since init
        if (now.count != dl->info[s].count || now.tok_bytes != dl->info[s].tok_bytes) {
            fail(EXIT_BADFILE, "%s: the shard changed while in use", dl->paths[s]);
        }
    }
    free(dl->perm);
    dl->perm = NULL;
    if (dl->shuffle && !dl->val) {
        if (dl->n_windows[s] > UINT32_MAX) { fail(EXIT_USAGE, "%s: more than 2^32 windows in one shard", dl->paths[s]); }
        dl->perm = (uint32_t*)mallocCheck((size_t)dl->n_windows[s] * sizeof(uint32_t));
        Rng r;
        rng_seed(&r, dl_stream_seed(dl->seed, dl->cur_epoch, s));
        dl_permute_u32(dl->perm, dl->n_windows[s], &r);
    }
    dl->cur_shard = s;
}

static void dataloader_next(DataLoader* dl) {
    uint64_t g = dl->consumed + (uint64_t)dl->rank;   // this process's window in the stream
    uint64_t epoch = g / dl->epoch_windows, i = g % dl->epoch_windows;
    dl_set_epoch(dl, epoch);
    int lo = 0, hi = dl->n_shards - 1;   // the position p in the epoch's order with start[p] <= i < start[p + 1]
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (dl->start[mid + 1] <= i) { lo = mid + 1; } else { hi = mid; }
    }
    int s = dl->order[lo];
    dl_open_shard(dl, s);
    uint64_t w = i - dl->start[lo];
    if (dl->perm) { w = dl->perm[w]; }
    size_t bt = (size_t)dl->B * (size_t)dl->T;
    uint64_t first = w * bt;
    shard_read_tokens(dl->fd, dl->paths[s], &dl->info[s], first, bt + 1, dl->raw);
    for (size_t k = 0; k <= bt; k++) {
        if (dl->raw[k] >= (uint32_t)dl->vocab_size) {
            fail(EXIT_BADFILE, "%s: token id %u at position %llu is outside the model's vocabulary (%d tokens)\n"
                 "  hint: the shards were made with a larger tokenizer than the model's --vocab", dl->paths[s],
                 dl->raw[k], (unsigned long long)(first + k), dl->vocab_size);
        }
    }
    for (size_t k = 0; k < bt; k++) { dl->inputs[k] = (int)dl->raw[k]; dl->targets[k] = (int)dl->raw[k + 1]; }
    if (dl->eot >= 0) { dl_segments(dl); }
    dl->last_epoch = epoch; dl->last_shard = s; dl->last_start = first;
    dl->consumed += (uint64_t)dl->world;
}

// the position and a fingerprint of what it means (settings and data), DATALOADER_STATE_WORDS words
static void dataloader_save_state(const DataLoader* dl, uint64_t* words, int* n) {
    words[0] = DATALOADER_STATE_MAGIC;
    words[1] = dl->consumed;
    words[2] = dl->seed;
    words[3] = (uint64_t)(dl->shuffle ? 1 : 0) | (uint64_t)(dl->val ? 2 : 0);
    words[4] = (uint64_t)dl->B;
    words[5] = (uint64_t)dl->T;
    words[6] = dl->total_windows;
    words[7] = (uint64_t)dl->n_shards;
    words[8] = dl->total_tokens;
    *n = DATALOADER_STATE_WORDS;
}

static void dataloader_restore_state(DataLoader* dl, const uint64_t* words, int n) {
    if (n != DATALOADER_STATE_WORDS || words[0] != DATALOADER_STATE_MAGIC) {
        fail(EXIT_BADFILE, "data position: not a data loader state (%d words%s)", n,
             n >= 1 && words[0] != DATALOADER_STATE_MAGIC ? ", bad magic" : "");
    }
    if (words[2] != dl->seed || words[3] != ((uint64_t)(dl->shuffle ? 1 : 0) | (uint64_t)(dl->val ? 2 : 0)) ||
        words[4] != (uint64_t)dl->B || words[5] != (uint64_t)dl->T) {
        fail(EXIT_USAGE, "data position was saved with other settings (seed %llu, shuffle %d, B %llu, T %llu; now seed %llu, "
             "shuffle %d, B %d, T %d)\n  hint: resume with the same --seed, -b and -t", (unsigned long long)words[2],
             (int)(words[3] & 1), (unsigned long long)words[4], (unsigned long long)words[5],
             (unsigned long long)dl->seed, dl->shuffle, dl->B, dl->T);
    }
    if (words[6] != dl->total_windows || words[7] != (uint64_t)dl->n_shards || words[8] != dl->total_tokens) {
        fail(EXIT_BADFILE, "data position was saved for other data (%llu shards, %llu tokens; now %d shards, %llu tokens)",
             (unsigned long long)words[7], (unsigned long long)words[8], dl->n_shards, (unsigned long long)dl->total_tokens);
    }
    if (words[1] % (uint64_t)dl->world != 0) {
        fail(EXIT_USAGE, "data position %llu (windows consumed) is not a multiple of the %d processes",
             (unsigned long long)words[1], dl->world);
    }
    dl->consumed = words[1];
}

static void dataloader_free(DataLoader* dl) {
    if (dl->fd >= 0) { close(dl->fd); }
    for (int i = 0; i < dl->n_shards; i++) { free(dl->paths[i]); }
    free(dl->paths); free(dl->info); free(dl->n_windows); free(dl->order); free(dl->start); free(dl->perm);
    free(dl->raw); free(dl->inputs); free(dl->targets); free(dl->seg);
    memset(dl, 0, sizeof(*dl));
}

#endif // PDN_DATALOADER_H
