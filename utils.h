/*
utils.h: small host-side helpers shared by train_pdn.c, train_pdn.cu, the tests and the dev tools.
defines: fail() (its message escaped: no raw control bytes reach the terminal), UTF-8 decoding and
print_text_escaped, xxxCheck macros carrying file and line, a checked size product, a seeded RNG (splitmix64 + xoshiro256**),
CRC-32 (IEEE, the same value zlib.crc32 gives), atomic file replacement (write temp, fsync, rename),
a growable text buffer, and a monotonic clock.
*/
#ifndef PDN_UTILS_H
#define PDN_UTILS_H

#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <stdarg.h>
#include <string.h>
#include <math.h>
#include <errno.h>
#include <time.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/stat.h>
#include <sys/types.h>

// ----------------------------------------------------------------------------------------------------
// errors: one line saying what went wrong and what to do, then a nonzero exit. Exit codes:
// 1 = bad command line or configuration, 2 = bad or unreadable input file, 3 = numerical failure (a loss, gradient
// norm or update that is not finite), 4 = out of memory or I/O failure while writing, 5 = another process of a
// multi-GPU job failed or did not answer (rendezvous or collective timed out), 6 = stopped by a signal (SIGINT,
// SIGTERM, SIGUSR1) after saving a checkpoint: -y 1 continues the run.

#define EXIT_USAGE 1
#define EXIT_BADFILE 2
#define EXIT_NUMERIC 3
#define EXIT_SYSTEM 4
#define EXIT_DIST 5
#define EXIT_STOPPED 6

// in a job of several processes the messages say which one failed (set once the rank is known; -1: one process)
static int fail_rank = -1;

// ----------------------------------------------------------------------------------------------------
// UTF-8, and text printed so that it cannot act on a terminal (messages quote file bytes, paths and flags)

// decode the code point at s[i] (i < n); *len gets its byte length. Returns -1 for a byte that does not start a
// valid shortest-form sequence (then *len = 1: the byte stands alone).
static int32_t utf8_decode(const uint8_t* s, size_t n, size_t i, size_t* len) {
    uint8_t b0 = s[i];
    *len = 1;
    if (b0 < 0x80) { return b0; }
    size_t need;
    uint32_t cp, lo2 = 0x80, hi2 = 0xBF;   // allowed range of the second byte (rules out overlong/surrogates)
    if (b0 >= 0xC2 && b0 <= 0xDF) { need = 1; cp = b0 & 0x1F; }
    else if (b0 >= 0xE0 && b0 <= 0xEF) {
        need = 2; cp = b0 & 0x0F;
        if (b0 == 0xE0) { lo2 = 0xA0; }
        if (b0 == 0xED) { hi2 = 0x9F; }
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
        need = 3; cp = b0 & 0x07;
        if (b0 == 0xF0) { lo2 = 0x90; }
        if (b0 == 0xF4) { hi2 = 0x8F; }
    } else { return -1; }
    if (i + need >= n) { return -1; }   // truncated at the end of the text
    for (size_t k = 1; k <= need; k++) {
        uint8_t b = s[i + k];
        uint32_t lo = k == 1 ? lo2 : 0x80, hi = k == 1 ? hi2 : 0xBF;
        if (b < lo || b > hi) { return -1; }
        cp = (cp << 6) | (b & 0x3F);
    }
    *len = need + 1;
    return (int32_t)cp;
}

// Text to a terminal or log, with every byte that could act on the terminal escaped: control characters other
// than newline and tab, DEL and the C1 controls (U+0080..U+009F) as \xNN of their bytes, bytes that are not valid
// UTF-8 (a sample can end inside a character, a model can emit any byte, a file can hold anything) as \xNN, and
// the backslash as \\ so that the escapes are unambiguous. Everything else, valid UTF-8 included, is printed as it is.
static void print_text_escaped(FILE* f, const uint8_t* s, size_t n) {
    for (size_t i = 0; i < n;) {
        size_t len;
        int32_t cp = utf8_decode(s, n, i, &len);
        if (cp == '\\') { fputs("\\\\", f); }
        else if (cp == '\n' || cp == '\t' || (cp >= 0x20 && cp != 0x7F && (cp < 0x80 || cp >= 0xA0))) { fwrite(s + i, 1, len, f); }
        else { for (size_t k = 0; k < len; k++) { fprintf(f, "\\x%02x", s[i + k]); } }
        i += len;
    }
}

// the message goes through print_text_escaped: it may quote bytes of a file, a path or a flag's value
static void fail(int code, const char* fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
static void fail(int code, const char* fmt, ...) {
    char msg[8192];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    size_t len = n < 0 ? 0 : (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1;
    if (fail_rank >= 0) { fprintf(stderr, "error (rank %d): ", fail_rank); } else { fprintf(stderr, "error: "); }
    print_text_escaped(stderr, (const uint8_t*)msg, len);
    fprintf(stderr, "\n");
    fflush(stdout);
    exit(code);
}

static FILE* fopen_check(const char* path, const char* mode, const char* file, int line) {
    FILE* f = fopen(path, mode);
    if (f == NULL) {
        fail(mode[0] == 'r' ? EXIT_BADFILE : EXIT_SYSTEM, "cannot open '%s' (mode %s): %s [%s:%d]\n"
             "  hint: check the path and permissions%s", path, mode, strerror(errno), file, line,
             mode[0] == 'r' ? "" : "; the output directory must exist and be writable");
    }
    return f;
}
#define fopenCheck(path, mode) fopen_check(path, mode, __FILE__, __LINE__)

// a short read means a truncated file: report it as such rather than as an I/O error
static void fread_check(void* ptr, size_t size, size_t n, FILE* f, const char* what, const char* file, int line) {
    size_t got = fread(ptr, size, n, f);
    if (got != n) {
        fail(EXIT_BADFILE, "%s: file is truncated or unreadable (wanted %zu items of %zu bytes, got %zu) [%s:%d]",
             what, n, size, got, file, line);
    }
}
#define freadCheck(ptr, size, n, f, what) fread_check(ptr, size, n, f, what, __FILE__, __LINE__)

static void fwrite_check(const void* ptr, size_t size, size_t n, FILE* f, const char* file, int line) {
    if (fwrite(ptr, size, n, f) != n) {
        fail(EXIT_SYSTEM, "write failed: %s [%s:%d]\n  hint: is the disk full?", strerror(errno), file, line);
    }
}
#define fwriteCheck(ptr, size, n, f) fwrite_check(ptr, size, n, f, __FILE__, __LINE__)

static void* malloc_check(size_t size, const char* file, int line) {
    void* p = malloc(size ? size : 1);
    if (p == NULL) {
        fail(EXIT_SYSTEM, "out of memory allocating %.1f MiB [%s:%d]\n  hint: lower -b (micro-batch) or -t",
             size / 1048576.0, file, line);
    }
    return p;
}
#define mallocCheck(size) malloc_check(size, __FILE__, __LINE__)

static void* calloc_check(size_t n, size_t size, const char* file, int line) {
    void* p = calloc(n ? n : 1, size ? size : 1);
    if (p == NULL) {
        fail(EXIT_SYSTEM, "out of memory allocating %.1f MiB [%s:%d]\n  hint: lower -b (micro-batch) or -t",
             (double)n * size / 1048576.0, file, line);
    }
    return p;
}
#define callocCheck(n, size) calloc_check(n, size, __FILE__, __LINE__)

// a * b for a size (elements or bytes): a product that does not fit in 64 bits ends the run (exit 1) instead of
// wrapping around to a small number (what is an absurd flag or a tampered header says, naming it)
static size_t mul_check(size_t a, size_t b, const char* what, const char* file, int line) {
    if (b != 0 && a > SIZE_MAX / b) { fail(EXIT_USAGE, "%s: %zu x %zu does not fit in 64 bits [%s:%d]", what, a, b, file, line); }
    return a * b;
}
#define mulCheck(a, b, what) mul_check(a, b, what, __FILE__, __LINE__)

// ----------------------------------------------------------------------------------------------------
// RNG: xoshiro256** seeded through splitmix64. Small, fast, and the same numbers on every platform.

typedef struct { uint64_t s[4]; } Rng;

static uint64_t splitmix64(uint64_t* x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void rng_seed(Rng* r, uint64_t seed) {
    for (int i = 0; i < 4; i++) { r->s[i] = splitmix64(&seed); }
}

static uint64_t rng_u64(Rng* r) {
    uint64_t* s = r->s;
    uint64_t x = s[1] * 5;
    uint64_t result = ((x << 7) | (x >> 57)) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3];
    s[2] ^= t;
    s[3] = (s[3] << 45) | (s[3] >> 19);
    return result;
}

// uniform in [0, 1) with 53 random bits
static double rng_uniform(Rng* r) { return (rng_u64(r) >> 11) * (1.0 / 9007199254740992.0); }

// uniform integer in [0, n), unbiased (rejection)
static uint64_t rng_below(Rng* r, uint64_t n) {
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do { x = rng_u64(r); } while (x >= limit);
    return x % n;
}

// standard normal by Box-Muller; both values of a pair are used, the spare is kept in the caller's state
typedef struct { Rng rng; int has_spare; double spare; } NormalRng;
static double rng_normal(NormalRng* n) {
    if (n->has_spare) { n->has_spare = 0; return n->spare; }
    double u1 = rng_uniform(&n->rng), u2 = rng_uniform(&n->rng);
    if (u1 < 1e-300) { u1 = 1e-300; }
    double rad = sqrt(-2.0 * log(u1));
    n->spare = rad * sin(2.0 * 3.14159265358979323846 * u2);
    n->has_spare = 1;
    return rad * cos(2.0 * 3.14159265358979323846 * u2);
}

// ----------------------------------------------------------------------------------------------------
// CRC-32 (IEEE 802.3, reflected, the zlib/PNG one), slicing-by-8: ~2 GB/s, so checksumming a 1.4 GB
// checkpoint costs under a second. Verify outside with python: zlib.crc32(data).

static uint32_t crc32_table[8][256];
static int crc32_ready = 0;

static void crc32_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) { c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1; }
        crc32_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++) {
        for (int s = 1; s < 8; s++) {
            uint32_t prev = crc32_table[s - 1][i];
            crc32_table[s][i] = (prev >> 8) ^ crc32_table[0][prev & 0xFF];
        }
    }
    crc32_ready = 1;
}

// continue a running crc (start with crc = 0)
static uint32_t crc32_update(uint32_t crc, const void* data, size_t n) {
    if (!crc32_ready) { crc32_init(); }
    const uint8_t* p = (const uint8_t*)data;
    crc = ~crc;
    while (n >= 8) {
        uint32_t a, b;
        memcpy(&a, p, 4); memcpy(&b, p + 4, 4); // little-endian host assumed (x86-64, aarch64)
        a ^= crc;
        crc = crc32_table[7][a & 0xFF] ^ crc32_table[6][(a >> 8) & 0xFF] ^ crc32_table[5][(a >> 16) & 0xFF] ^
              crc32_table[4][a >> 24] ^ crc32_table[3][b & 0xFF] ^ crc32_table[2][(b >> 8) & 0xFF] ^
              crc32_table[1][(b >> 16) & 0xFF] ^ crc32_table[0][b >> 24];
        p += 8; n -= 8;
    }
    while (n--) { crc = (crc >> 8) ^ crc32_table[0][(crc ^ *p++) & 0xFF]; }
    return ~crc;
}

// ----------------------------------------------------------------------------------------------------
// a growable text buffer (for the self-describing file headers)

typedef struct { char* s; size_t len, cap; } TextBuf;

static void tb_printf(TextBuf* tb, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static void tb_printf(TextBuf* tb, const char* fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        size_t room = tb->cap - tb->len;
        int n = vsnprintf(tb->s ? tb->s + tb->len : NULL, tb->s ? room : 0, fmt, ap);
        va_end(ap);
        if (n < 0) { fail(EXIT_SYSTEM, "vsnprintf failed"); }
        if (tb->s && (size_t)n < room) { tb->len += (size_t)n; return; }
        size_t cap = tb->cap ? tb->cap : 1024;
        while (cap < tb->len + (size_t)n + 1) { cap *= 2; }
        char* s = (char*)realloc(tb->s, cap);
        if (!s) { fail(EXIT_SYSTEM, "out of memory (text buffer)"); }
        tb->s = s; tb->cap = cap;
    }
}

// ----------------------------------------------------------------------------------------------------
// files

// Atomic replacement: the new content goes to "<path>.tmp", is fsync'ed, then renamed over <path> and the
// directory is fsync'ed. A crash at any point leaves either the old file or the new one, never a torn one.
// The atomic_try_* steps return 0 or an errno value and leave the decision to the caller (a checkpoint pair is written
// as one: both temporaries, then both renames); atomic_open / atomic_commit fail on error, naming the file.
typedef struct { FILE* f; char path[1024]; char tmp[1040]; } AtomicFile;

static int atomic_try_open(AtomicFile* af, const char* path) {
    af->f = NULL;
    if (strlen(path) >= sizeof(af->path)) { fail(EXIT_USAGE, "path too long: %s", path); }
    strcpy(af->path, path);
    snprintf(af->tmp, sizeof(af->tmp), "%s.tmp", path);
    af->f = fopen(af->tmp, "wb");
    return af->f ? 0 : errno;
}

static int atomic_try_write(AtomicFile* af, const void* p, size_t n) {
    errno = 0;
    return fwrite(p, 1, n, af->f) == n ? 0 : errno ? errno : EIO;
}

// flush, fsync and close the temporary (it stays at af->tmp until atomic_try_rename)
static int atomic_try_finish(AtomicFile* af) {
    int err = 0;
    if (fflush(af->f) != 0 || fsync(fileno(af->f)) != 0) { err = errno; }
    if (fclose(af->f) != 0 && !err) { err = errno; }
    af->f = NULL;
    return err;
}

static int atomic_try_rename(AtomicFile* af) {
    if (rename(af->tmp, af->path) != 0) { return errno; }
    // make the rename itself durable
    char dir[1024];
    strcpy(dir, af->path);
    char* slash = strrchr(dir, '/');
    if (slash) { *slash = 0; } else { strcpy(dir, "."); }
    int fd = open(dir, O_RDONLY);
    if (fd >= 0) { fsync(fd); close(fd); }
    return 0;
}

// close (if open) and remove the temporary: <path> stays as it was
static void atomic_discard(AtomicFile* af) {
    if (af->f) { fclose(af->f); af->f = NULL; }
    unlink(af->tmp);
}

static void atomic_fail(AtomicFile* af, int err) __attribute__((noreturn));
static void atomic_fail(AtomicFile* af, int err) {
    atomic_discard(af);
    fail(EXIT_SYSTEM, "cannot write '%s': %s (its temporary was removed; an earlier '%s' is untouched)\n"
         "  hint: is the disk full, or the directory not writable?", af->path, strerror(err), af->path);
}

static void atomic_open(AtomicFile* af, const char* path) {
    int err = atomic_try_open(af, path);
    if (err) { atomic_fail(af, err); }
}

static void atomic_commit(AtomicFile* af) {
    int err = atomic_try_finish(af);
    if (!err) { err = atomic_try_rename(af); }
    if (err) { atomic_fail(af, err); }
}

static int file_exists(const char* path) { struct stat st; return stat(path, &st) == 0; }

static long long file_size(FILE* f) {
    struct stat st;
    if (fstat(fileno(f), &st) != 0) { return -1; }
    return (long long)st.st_size;
}

// the directory and every missing one above it, like mkdir -p
static void ensure_dir(const char* dir) {
    struct stat st;
    if (stat(dir, &st) == 0) {
        if (!S_ISDIR(st.st_mode)) { fail(EXIT_USAGE, "'%s' exists and is not a directory", dir); }
        return;
    }
    char parent[1024];
    if (strlen(dir) >= sizeof parent) { fail(EXIT_USAGE, "path too long: %s", dir); }
    strcpy(parent, dir);
    char* slash = strrchr(parent, '/');
    while (slash && slash > parent && slash[1] == 0) { *slash = 0; slash = strrchr(parent, '/'); }   // trailing '/'
    if (slash && slash > parent) { *slash = 0; ensure_dir(parent); }
    // EEXIST: another process of the job made it in between
    if (mkdir(dir, 0755) != 0 && !(errno == EEXIST && stat(dir, &st) == 0 && S_ISDIR(st.st_mode))) {
        fail(EXIT_SYSTEM, "cannot create directory '%s': %s", dir, strerror(errno));
    }
}

static double wall_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

#endif // PDN_UTILS_H
