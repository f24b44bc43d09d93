/*
dist.h: what a data-parallel job of several processes needs besides NCCL, in plain C so the CPU tests run it.
defines:
  - who this process is (dist_env_detect): rank, world size and local GPU from the launcher's environment
    (Open MPI's mpirun, Slurm's srun, MPICH/Intel MPI's PMI, torchrun-style RANK/WORLD_SIZE/LOCAL_RANK) or from
    the --rank / --world-size / --local-rank flags, which win;
  - the rendezvous without MPI: rank 0 hands an opaque blob (NCCL's 128-byte unique id) to every other rank,
    either over TCP (dist_tcp_serve / dist_tcp_join: rank 0 listens on --dist-port of --dist-host) or through a
    directory on a shared file system (dist_file_rendezvous, --dist-dir), both with a deadline;
  - the ZeRO-1 shard plan (zero_plan_build): which part of the flat parameter buffer of pdn.h each rank's
    optimizer owns, and how the flat gradients are packed into per-bucket buffers for NCCL's reduce-scatter.

The file rendezvous never uses a stale id. Every rank r > 0 writes hello.r holding a fresh random nonce; rank 0
answers each nonce it sees in id.r (the nonce and the blob) and keeps answering while hello.r changes; rank r
accepts id.r only when it carries its own nonce, then writes ack.r = (its nonce, a 64-bit hash of the blob);
rank 0 finishes when every ack matches the nonce it answered and the hash of its fresh blob. Files left by a
crashed earlier run (same directory) are answered or ignored, never taken; rank 0 removes the files at the end.
Two jobs must not share one directory at the same time (use one per job, e.g. with $SLURM_JOB_ID in it).
*/
#ifndef PDN_DIST_H
#define PDN_DIST_H

#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include "utils.h"
#include "pdn.h"

// ----------------------------------------------------------------------------------------------------
// who this process is

typedef struct {
    int rank, world, local_rank;   // local_rank -1: not known (the trainer then takes rank % visible GPUs)
    char source[64];               // where rank and world came from, for the printout
} DistEnv;

// an environment variable holding a count; 0 if unset
static int dist_env_int(const char* name, int* out) {
    const char* v = getenv(name);
    if (!v || !*v) { return 0; }
    char* end;
    long x = strtol(v, &end, 10);
    if (*end || x < 0 || x > 1000000) { fail(EXIT_USAGE, "environment variable %s=%s is not a process count or index", name, v); }
    *out = (int)x;
    return 1;
}

// flag_rank >= 0, flag_world > 0, flag_local >= 0 override the environment. Slurm counts only inside an srun step
// (SLURM_STEP_NUM_TASKS): the batch script itself also has SLURM_NTASKS, but runs one process.
static void dist_env_detect(DistEnv* de, int flag_rank, int flag_world, int flag_local) {
    static const char* const sets[][4] = {
        {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
        {"Slurm", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID"},
        {"PMI", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
        {"RANK/WORLD_SIZE", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
    };
    memset(de, 0, sizeof(*de));
    de->world = 1;
    de->local_rank = -1;
    snprintf(de->source, sizeof de->source, "one process");
    for (size_t i = 0; i < sizeof(sets) / sizeof(sets[0]); i++) {
        int r, w;
        if (dist_env_int(sets[i][1], &r) && dist_env_int(sets[i][2], &w)) {
            de->rank = r; de->world = w;
            if (!dist_env_int(sets[i][3], &de->local_rank)) { de->local_rank = -1; }
            snprintf(de->source, sizeof de->source, "%s environment", sets[i][0]);
            break;
        }
    }
    if (flag_world > 0) { de->world = flag_world; snprintf(de->source, sizeof de->source, "--world-size / --rank"); }
    if (flag_rank >= 0) { de->rank = flag_rank; }
    if (flag_local >= 0) { de->local_rank = flag_local; }
    if (de->world < 1 || de->rank < 0 || de->rank >= de->world) {
        fail(EXIT_USAGE, "rank %d of %d processes (%s) is impossible: need 0 <= rank < world size", de->rank, de->world, de->source);
    }
}

// ----------------------------------------------------------------------------------------------------
// rendezvous helpers: a fresh nonce, a 64-bit hash of the blob, hex

static uint64_t dist_nonce(void) {
    uint64_t x = 0;
    int fd = open("/dev/urandom", O_RDONLY);
    if (fd >= 0) {
        if (read(fd, &x, sizeof x) != (ssize_t)sizeof x) { x = 0; }
        close(fd);
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t s = x ^ ((uint64_t)ts.tv_sec << 20) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 40);
    x = splitmix64(&s);
    return x ? x : 1;   // 0 means "none" below
}

static uint64_t dist_hash(const void* blob, size_t n) {   // FNV-1a, 64 bits
    const uint8_t* p = (const uint8_t*)blob;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) { h = (h ^ p[i]) * 0x100000001b3ull; }
    return h;
}

static void dist_sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

// ----------------------------------------------------------------------------------------------------
// TCP rendezvous: rank 0 listens on `port` (all IPv4 interfaces), every other rank connects to host:port (retrying
// until rank 0 is up), says (magic, rank, world) and gets (magic, status, world) and the blob back.

#define DIST_TCP_MAGIC 0x3130564452444E50ull   // "PNDRDV01"
enum { DIST_OK = 0, DIST_WORLD_MISMATCH = 1, DIST_BAD_RANK = 2, DIST_DUP_RANK = 3 };
typedef struct { uint64_t magic; uint32_t rank, world; } DistHello;
typedef struct { uint64_t magic; uint32_t status, world; } DistReply;

// move exactly n bytes over fd before the deadline (wall_seconds); 0 done, -1 closed, error or late
static int dist_io(int fd, void* buf, size_t n, int writing, double deadline) {
    char* p = (char*)buf;
    while (n > 0) {
        double left = deadline - wall_seconds();
        if (left <= 0) { return -1; }
        struct pollfd pf = {fd, (short)(writing ? POLLOUT : POLLIN), 0};
        int pr = poll(&pf, 1, (int)(left * 1000) + 1);
        if (pr < 0 && errno == EINTR) { continue; }
        if (pr <= 0) { return -1; }
        ssize_t k = writing ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
        if (k < 0 && (errno == EINTR || errno == EAGAIN)) { continue; }
        if (k <= 0) { return -1; }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

// rank 0: serve the blob to the world - 1 other ranks; fails (exit 5) when they have not all come by the deadline
static void dist_tcp_serve(int port, int world, const void* blob, size_t nb, double timeout_s) {
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    if (ls < 0) { fail(EXIT_DIST, "rendezvous: cannot create a socket: %s", strerror(errno)); }
    int one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = htons((uint16_t)port);
    if (bind(ls, (struct sockaddr*)&addr, sizeof addr) != 0 || listen(ls, 128) != 0) {
        fail(EXIT_DIST, "rendezvous: rank 0 cannot listen on port %d: %s\n  hint: pick a free port with --dist-port", port,
             strerror(errno));
    }
    char* got = (char*)calloc((size_t)world, 1);
    int joined = 1;
    double deadline = wall_seconds() + timeout_s;
    while (joined < world) {
        double left = deadline - wall_seconds();
        struct pollfd pf = {ls, POLLIN, 0};
        int pr = left > 0 ? poll(&pf, 1, (int)(left * 1000) + 1) : 0;
        if (pr < 0 && errno == EINTR) { continue; }
        if (pr <= 0) {
            char missing[256] = "";
            size_t at = 0;
            for (int r = 1; r < world && at + 16 < sizeof missing; r++) {
                if (!got[r]) { at += (size_t)snprintf(missing + at, sizeof missing - at, " %d", r); }
            }
            fail(EXIT_DIST, "rendezvous: after %.0f s, %d of %d processes have not reached rank 0 on port %d (missing ranks:%s)\n"
                 "  hint: did they all start, with the same --dist-host/--dist-port and --world-size? raise --dist-timeout "
                 "if the scheduler starts them slowly", timeout_s, world - joined, world, port, missing);
        }
        int fd = accept(ls, NULL, NULL);
        if (fd < 0) { continue; }
        DistHello h;
        double conn_deadline = wall_seconds() + 10.0 < deadline ? wall_seconds() + 10.0 : deadline;
        if (dist_io(fd, &h, sizeof h, 0, conn_deadline) != 0 || h.magic != DIST_TCP_MAGIC) { close(fd); continue; } // not ours
        DistReply rep = {DIST_TCP_MAGIC, DIST_OK, (uint32_t)world};
        if ((int)h.world != world) { rep.status = DIST_WORLD_MISMATCH; }
        else if (h.rank < 1 || (int)h.rank >= world) { rep.status = DIST_BAD_RANK; }
        else if (got[h.rank]) { rep.status = DIST_DUP_RANK; }
        int sent = dist_io(fd, &rep, sizeof rep, 1, conn_deadline) == 0 &&
                   (rep.status != DIST_OK || dist_io(fd, (void*)blob, nb, 1, conn_deadline) == 0);
        close(fd);
        if (rep.status == DIST_WORLD_MISMATCH) {
            fail(EXIT_DIST, "rendezvous: rank %u says the job has %u processes, rank 0 has %d\n  hint: give every process "
                 "the same --world-size (or launcher)", h.rank, h.world, world);
        }
        if (rep.status != DIST_OK) {
            fail(EXIT_DIST, "rendezvous: %s rank %u (world %d)\n  hint: every process needs its own --rank in 1..%d", rep.status ==
                 DIST_DUP_RANK ? "two processes claim" : "impossible", h.rank, world, world - 1);
        }
        if (sent) { got[h.rank] = 1; joined++; }
    }
    free(got);
    close(ls);
}

// rank > 0: fetch the blob from rank 0 at host:port, retrying the connection until the deadline
static void dist_tcp_join(const char* host, int port, int rank, int world, void* blob, size_t nb, double timeout_s) {
    double deadline = wall_seconds() + timeout_s;
    char ps[16], why[256] = "no attempt";
    snprintf(ps, sizeof ps, "%d", port);
    for (;;) {
        if (wall_seconds() > deadline) {
            fail(EXIT_DIST, "rendezvous: could not get the NCCL id from rank 0 at %s:%d within %.0f s (last: %s)\n"
                 "  hint: is rank 0 running, is --dist-host the address of rank 0's node, and is the port reachable?",
                 host, port, timeout_s, why);
        }
        struct addrinfo hints, *res = NULL;
        memset(&hints, 0, sizeof hints);
        hints.ai_family = AF_INET;
        hints.ai_socktype = SOCK_STREAM;
        int gr = getaddrinfo(host, ps, &hints, &res);
        if (gr != 0) { snprintf(why, sizeof why, "cannot resolve '%s': %s", host, gai_strerror(gr)); dist_sleep_ms(500); continue; }
        int fd = socket(res->ai_family, res->ai_socktype, res->ai_protocol);
        int ok = fd >= 0;
        if (ok) { // non-blocking connect, so an unreachable host cannot block past the deadline
            fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
            int cr = connect(fd, res->ai_addr, res->ai_addrlen);
            if (cr != 0 && errno == EINPROGRESS) {
                struct pollfd pf = {fd, POLLOUT, 0};
                double left = deadline - wall_seconds();
                int err = 0;
                socklen_t el = sizeof err;
                cr = poll(&pf, 1, left > 2 ? 2000 : (int)(left * 1000) + 1) == 1 &&
                     getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) == 0 && err == 0 ? 0 : -1;
                if (err) { errno = err; }
            }
            if (cr != 0) { snprintf(why, sizeof why, "connect: %s", strerror(errno ? errno : ETIMEDOUT)); ok = 0; }
        }
        freeaddrinfo(res);
        if (ok) {
            DistHello h = {DIST_TCP_MAGIC, (uint32_t)rank, (uint32_t)world};
            DistReply rep;
            if (dist_io(fd, &h, sizeof h, 1, deadline) == 0 && dist_io(fd, &rep, sizeof rep, 0, deadline) == 0 &&
                rep.magic == DIST_TCP_MAGIC) {
                if (rep.status == DIST_WORLD_MISMATCH) {
                    fail(EXIT_DIST, "rendezvous: rank 0 runs a job of %u processes, this one says %d\n  hint: give every process "
                         "the same --world-size (or launcher)", rep.world, world);
                }
                if (rep.status != DIST_OK) {
                    fail(EXIT_DIST, "rendezvous: rank 0 refused rank %d (%s)", rank, rep.status == DIST_DUP_RANK ?
                         "another process already has this rank" : "rank out of range");
                }
                if (dist_io(fd, blob, nb, 0, deadline) == 0) { close(fd); return; }
            }
            snprintf(why, sizeof why, "rank 0 closed the connection or did not answer");
        }
        if (fd >= 0) { close(fd); }
        dist_sleep_ms(200);
    }
}

// ----------------------------------------------------------------------------------------------------
// file rendezvous (see the top of this file): files hello.R, id.R, ack.R in `dir`, written atomically (temp + rename)

static void dist_file_write(const char* path, const char* text) {
    char tmp[1200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    FILE* f = fopen(tmp, "w");
    if (!f || fputs(text, f) < 0 || fclose(f) != 0) {
        fail(EXIT_DIST, "rendezvous: cannot write '%s': %s\n  hint: --dist-dir must be a writable directory shared by all "
             "processes", tmp, strerror(errno));
    }
    if (rename(tmp, path) != 0) { fail(EXIT_DIST, "rendezvous: cannot rename '%s' to '%s': %s", tmp, path, strerror(errno)); }
}

// the first line of a small file into buf; 0 if it does not exist (yet) or is empty
static int dist_file_read(const char* path, char* buf, size_t n) {
    FILE* f = fopen(path, "r");
    if (!f) { return 0; }
    int ok = fgets(buf, (int)n, f) != NULL;
    fclose(f);
    return ok;
}

static void dist_hex(const void* blob, size_t nb, char* out) {
    const uint8_t* p = (const uint8_t*)blob;
    for (size_t i = 0; i < nb; i++) { sprintf(out + 2 * i, "%02x", p[i]); }
    out[2 * nb] = 0;
}

static int dist_unhex(const char* s, void* blob, size_t nb) {
    uint8_t* p = (uint8_t*)blob;
    for (size_t i = 0; i < nb; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1) { return -1; }
        p[i] = (uint8_t)v;
    }
    return 0;
}

#define DIST_FILE_TAG "pdn-rendezvous-1"

// every rank calls it; rank 0's blob goes to all. `dir` must exist on a file system all processes see.
static void dist_file_rendezvous(const char* dir, int rank, int world, void* blob, size_t nb, double timeout_s) {
    char path[1100], line[1400], hex[1100];
    if (nb * 2 + 1 > sizeof hex) { fail(EXIT_USAGE, "rendezvous: blob too large"); }
    double deadline = wall_seconds() + timeout_s;
    if (rank > 0) {
        uint64_t nonce = dist_nonce();
        snprintf(path, sizeof path, "%s/hello.%d", dir, rank);
        snprintf(line, sizeof line, "%s world %d nonce %016llx\n", DIST_FILE_TAG, world, (unsigned long long)nonce);
        dist_file_write(path, line);
        snprintf(path, sizeof path, "%s/id.%d", dir, rank);
        for (;;) {
            int w;
            unsigned long long got;
            if (dist_file_read(path, line, sizeof line) &&
                sscanf(line, DIST_FILE_TAG " world %d nonce %llx blob %1099s", &w, &got, hex) == 3 && got == nonce) {
                if (w != world) {
                    fail(EXIT_DIST, "rendezvous: rank 0 runs a job of %d processes, this one says %d\n  hint: give every "
                         "process the same --world-size (or launcher)", w, world);
                }
                if (strlen(hex) != 2 * nb || dist_unhex(hex, blob, nb) != 0) { fail(EXIT_DIST, "rendezvous: '%s' is garbled", path); }
                break;
            }
            if (wall_seconds() > deadline) {
                fail(EXIT_DIST, "rendezvous: no answer from rank 0 in '%s' within %.0f s\n  hint: is rank 0 running, with the "
                     "same --dist-dir (a directory all nodes share)? raise --dist-timeout if it starts late", dir, timeout_s);
            }
            dist_sleep_ms(50);
        }
        snprintf(path, sizeof path, "%s/ack.%d", dir, rank);
        snprintf(line, sizeof line, "%s nonce %016llx hash %016llx\n", DIST_FILE_TAG, (unsigned long long)nonce,
                 (unsigned long long)dist_hash(blob, nb));
        dist_file_write(path, line);
        return;
    }
    // rank 0: answer every hello nonce it sees until all ranks have acknowledged the blob of this run
    uint64_t h = dist_hash(blob, nb);
    uint64_t* answered = (uint64_t*)calloc((size_t)world, sizeof(uint64_t));
    char* done = (char*)calloc((size_t)world, 1);
    int left = world - 1;
    dist_hex(blob, nb, hex);
    while (left > 0) {
        for (int r = 1; r < world; r++) {
            if (done[r]) { continue; }
            int w;
            unsigned long long nonce, an, ah;
            snprintf(path, sizeof path, "%s/hello.%d", dir, r);
            if (dist_file_read(path, line, sizeof line) &&
                sscanf(line, DIST_FILE_TAG " world %d nonce %llx", &w, &nonce) == 2 && nonce != answered[r]) {
                char idp[1100], text[1400];
                snprintf(idp, sizeof idp, "%s/id.%d", dir, r);
                snprintf(text, sizeof text, "%s world %d nonce %016llx blob %s\n", DIST_FILE_TAG, world, nonce, hex);
                dist_file_write(idp, text);
                answered[r] = nonce;
            }
            snprintf(path, sizeof path, "%s/ack.%d", dir, r);
            if (answered[r] && dist_file_read(path, line, sizeof line) &&
                sscanf(line, DIST_FILE_TAG " nonce %llx hash %llx", &an, &ah) == 2 && an == answered[r] && ah == h) {
                done[r] = 1;
                left--;
            }
        }
        if (left > 0 && wall_seconds() > deadline) {
            fail(EXIT_DIST, "rendezvous: after %.0f s, %d of %d processes have not answered in '%s'\n  hint: did they all "
                 "start, with the same --dist-dir and --world-size? raise --dist-timeout if the scheduler starts them slowly",
                 timeout_s, left, world, dir);
        }
        if (left > 0) { dist_sleep_ms(50); }
    }
    for (int r = 1; r < world; r++) { // tidy up; a leftover file would be harmless
        const char* names[3] = {"hello", "id", "ack"};
        for (int k = 0; k < 3; k++) { snprintf(path, sizeof path, "%s/%s.%d", dir, names[k], r); unlink(path); }
    }
    free(answered);
    free(done);
}

// ----------------------------------------------------------------------------------------------------
// ZeRO-1 shard plan.
// Gradients become final bucket by bucket during the backward pass: first the classifier's and the final norm's
// (bucket 0), then layer L-1's ... layer 0's (buckets 1..L), the embedding's last (bucket L+1). A bucket is a list
// of ranges of the flat buffer (a layer's slice of every per-layer tensor); they are packed back to back into the
// bucket's part of the packed buffer, padded to a multiple of world * PDN_ALIGN elements, and NCCL reduce-scatters
// each bucket as soon as the backward has finished it, on its own stream. Rank r owns piece r of every bucket
// (size/world elements): its shard is those pieces one after the other, and its fp32 master weights and AdamW
// moments hold only them. The alignment gaps of the flat layout belong to no range: nobody owns them.

typedef struct { size_t flat, packed, n; int tensor; } ZeroRange;        // flat[flat .. +n) <-> packed[packed .. +n)
typedef struct { size_t shard, packed, flat, n; int tensor; } ZeroSeg;   // a run of this rank's shard

typedef struct {
    int world, rank, n_buckets;
    int* bucket_first;      // [n_buckets + 1] bucket b holds ranges[bucket_first[b] .. bucket_first[b + 1])
    size_t* bucket_off;     // [n_buckets + 1] packed offset of bucket b; bucket_off[n_buckets] = packed_total
    ZeroRange* ranges; int n_ranges;
    ZeroSeg* segs; int n_segs;   // this rank's shard, in shard order
    size_t packed_total, shard_total;   // shard_total = packed_total / world
} ZeroPlan;

static size_t zero_piece(const ZeroPlan* zp, int b) { return (zp->bucket_off[b + 1] - zp->bucket_off[b]) / (size_t)zp->world; }

static void zero_plan_build(const PdnConfig* c, const PdnLayout* lay, int world, int rank, ZeroPlan* zp) {
    memset(zp, 0, sizeof(*zp));
    int L = c->n_layer;
    zp->world = world; zp->rank = rank; zp->n_buckets = L + 2;
    zp->bucket_first = (int*)mallocCheck((size_t)(zp->n_buckets + 1) * sizeof(int));
    zp->bucket_off = (size_t*)mallocCheck((size_t)(zp->n_buckets + 1) * sizeof(size_t));
    zp->ranges = (ZeroRange*)mallocCheck((size_t)(NUM_TENSORS * (L + 1)) * sizeof(ZeroRange));
    size_t unit = (size_t)world * PDN_ALIGN, packed = 0;
    for (int b = 0; b < zp->n_buckets; b++) {
        zp->bucket_first[b] = zp->n_ranges;
        zp->bucket_off[b] = packed;
        for (int i = 0; i < NUM_TENSORS; i++) {
            const PdnTensor* t = &lay->t[i];
            if (!t->numel) { continue; }
            size_t flat;
            if (b == 0) { if (t->per_layer || i == T_WTE) { continue; } flat = t->offset; }             // final norm, head
            else if (b <= L) { if (!pdn_layer_has(c, t, L - b)) { continue; } flat = pdn_slice(lay, i, L - b); }
            else { if (i != T_WTE) { continue; } flat = t->offset; }                                        // embedding
            ZeroRange* r = &zp->ranges[zp->n_ranges++];
            r->flat = flat; r->packed = packed; r->n = t->per_layer ? t->layer_numel : t->numel; r->tensor = i;
            packed += r->n;
        }
        packed = zp->bucket_off[b] + (packed - zp->bucket_off[b] + unit - 1) / unit * unit; // (no bucket is empty)
    }
    zp->bucket_first[zp->n_buckets] = zp->n_ranges;
    zp->bucket_off[zp->n_buckets] = packed;
    zp->packed_total = packed;
    zp->shard_total = packed / (size_t)world;
    // this rank's piece of every bucket, cut along the ranges
    zp->segs = (ZeroSeg*)mallocCheck((size_t)(zp->n_ranges + zp->n_buckets) * sizeof(ZeroSeg));
    for (int b = 0; b < zp->n_buckets; b++) {
        size_t s = zero_piece(zp, b), lo = zp->bucket_off[b] + (size_t)rank * s, hi = lo + s;
        for (int k = zp->bucket_first[b]; k < zp->bucket_first[b + 1]; k++) {
            const ZeroRange* r = &zp->ranges[k];
            size_t a = r->packed > lo ? r->packed : lo, e = r->packed + r->n < hi ? r->packed + r->n : hi;
            if (a >= e) { continue; }
            ZeroSeg* g = &zp->segs[zp->n_segs++];
            g->shard = zp->bucket_off[b] / (size_t)world + (a - lo);
            g->packed = a; g->flat = r->flat + (a - r->packed); g->n = e - a; g->tensor = r->tensor;
        }
    }
}

static void zero_plan_free(ZeroPlan* zp) {
    free(zp->bucket_first); free(zp->bucket_off); free(zp->ranges); free(zp->segs);
    memset(zp, 0, sizeof(*zp));
}

// host copies: this rank's shard out of a full flat buffer (padding 0), and back into one
static void zero_shard_from_flat(const ZeroPlan* zp, const float* flat, float* shard) {
    memset(shard, 0, zp->shard_total * sizeof(float));
    for (int k = 0; k < zp->n_segs; k++) { memcpy(shard + zp->segs[k].shard, flat + zp->segs[k].flat, zp->segs[k].n * sizeof(float)); }
}

static void zero_shard_to_flat(const ZeroPlan* zp, const float* shard, float* flat) {
    for (int k = 0; k < zp->n_segs; k++) { memcpy(flat + zp->segs[k].flat, shard + zp->segs[k].shard, zp->segs[k].n * sizeof(float)); }
}

#endif // PDN_DIST_H
