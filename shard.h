/*
shard.h: token shard files in llm.c's format: the header, a streaming writer and checked readers.

    int32 header[256] (1024 bytes, little-endian), then the tokens:
      [0] magic    20240520 for uint16 tokens (version 1), 20240801 for uint32 tokens (version 7, llm.c's llama-3
                   variant; for vocabularies over 65,535 tokens)
      [1] version  1 or 7, as above
      [2] token count, low 32 bits
      [3] token count, high 32 bits (0 below 2^31 tokens, so every shard llm.c can write reads unchanged; llm.c
          itself stops at 2^31 and would refuse a bigger shard of ours by its file-size check)
      [4..255] 0
    then count tokens of 2 or 4 bytes. Documents are concatenated, each preceded by the end-of-text token.

All offsets are 64-bit (off_t, pread), so shards over 2 GB work. Every reader checks the magic, the version and
that the file size is exactly 1024 + count * token bytes, and fails with exit code 2 otherwise.

API:
  void shard_header_make(int32_t h[256], int tok_bytes, uint64_t count);
  void shard_info(const char* path, ShardInfo* info);     // reads and checks the header against the file size
  void shard_read_tokens(int fd, const char* path, const ShardInfo* info, uint64_t start, size_t n, uint32_t* out);
  int* shard_read_all(const char* path, ShardInfo* info);  // all tokens as ints (for small shards and tests)
  void shard_writer_open(ShardWriter* w, const char* path, int tok_bytes);   // atomic: path.tmp, renamed at close
  void shard_writer_put(ShardWriter* w, const int* ids, size_t n);
  void shard_writer_close(ShardWriter* w);
  void shard_write(const char* path, int tok_bytes, const int* ids, size_t n);
*/
#ifndef PDN_SHARD_H
#define PDN_SHARD_H

#include "utils.h"

#define SHARD_MAGIC_U16 20240520
#define SHARD_VERSION_U16 1
#define SHARD_MAGIC_U32 20240801
#define SHARD_VERSION_U32 7
#define SHARD_HEADER_INTS 256
#define SHARD_HEADER_BYTES 1024

// shards over 2 GB need 64-bit file offsets (always so on 64-bit Linux and macOS). The trainers share this header
// with train_pdn.cu, compiled as C++, which spells the assertion static_assert.
#ifdef __cplusplus
static_assert(sizeof(off_t) == 8, "64-bit off_t needed for shards over 2 GB: compile with -D_FILE_OFFSET_BITS=64");
#else
_Static_assert(sizeof(off_t) == 8, "64-bit off_t needed for shards over 2 GB: compile with -D_FILE_OFFSET_BITS=64");
#endif

typedef struct { int tok_bytes; uint64_t count; } ShardInfo;

static void shard_header_make(int32_t h[SHARD_HEADER_INTS], int tok_bytes, uint64_t count) {
    memset(h, 0, SHARD_HEADER_BYTES);
    h[0] = tok_bytes == 2 ? SHARD_MAGIC_U16 : SHARD_MAGIC_U32;
    h[1] = tok_bytes == 2 ? SHARD_VERSION_U16 : SHARD_VERSION_U32;
    h[2] = (int32_t)(uint32_t)(count & 0xFFFFFFFFu);
    h[3] = (int32_t)(uint32_t)(count >> 32);
}

// checks a header against the file's size; fills info
static void shard_header_parse(const int32_t h[SHARD_HEADER_INTS], const char* path, long long file_bytes, ShardInfo* info) {
    if (h[0] == SHARD_MAGIC_U16) {
        if (h[1] != SHARD_VERSION_U16) {
            fail(EXIT_BADFILE, "%s: uint16 shard (magic %d) with version %d, expected %d",
                 path, h[0], h[1], SHARD_VERSION_U16);
        }
        info->tok_bytes = 2;
    } else if (h[0] == SHARD_MAGIC_U32) {
        if (h[1] != SHARD_VERSION_U32) {
            fail(EXIT_BADFILE, "%s: uint32 shard (magic %d) with version %d, expected %d",
                 path, h[0], h[1], SHARD_VERSION_U32);
        }
        info->tok_bytes = 4;
    } else {
        fail(EXIT_BADFILE, "%s: not a token shard (bad magic %d; expected %d for uint16 or %d for uint32 tokens)",
             path, h[0], SHARD_MAGIC_U16, SHARD_MAGIC_U32);
    }
    info->count = (uint64_t)(uint32_t)h[2] | ((uint64_t)(uint32_t)h[3] << 32);
    for (int i = 4; i < SHARD_HEADER_INTS; i++) {
        if (h[i] != 0) {
            fail(EXIT_BADFILE, "%s: header word %d is %d, expected 0 (not a shard of this format?)", path, i, h[i]);
        }
    }
    if (info->count > (uint64_t)1 << 48) {
        fail(EXIT_BADFILE, "%s: implausible token count %llu", path, (unsigned long long)info->count);
    }
    long long want = SHARD_HEADER_BYTES + (long long)info->count * info->tok_bytes;
    if (file_bytes != want) {
        fail(EXIT_BADFILE, "%s: size mismatch: the header says %llu tokens of %d bytes (%lld bytes in all), the file has %lld "
             "bytes (%s)", path, (unsigned long long)info->count, info->tok_bytes, want, file_bytes,
             file_bytes < want ? "truncated" : "trailing bytes");
    }
}

// exactly n bytes at offset off, or a clear error
static void pread_full(int fd, void* buf, size_t n, off_t off, const char* path) {
    uint8_t* p = (uint8_t*)buf;
    while (n > 0) {
        ssize_t got = pread(fd, p, n, off);
        if (got < 0 && errno == EINTR) { continue; }
        if (got < 0) { fail(EXIT_BADFILE, "%s: read failed at byte %lld: %s", path, (long long)off, strerror(errno)); }
        if (got == 0) {
            fail(EXIT_BADFILE, "%s: file is truncated (no data at byte %lld; did it change while in use?)",
                 path, (long long)off);
        }
        p += got; n -= (size_t)got; off += got;
    }
}

static int shard_open_fd(const char* path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) { fail(EXIT_BADFILE, "cannot open shard '%s': %s", path, strerror(errno)); }
    return fd;
}

static void shard_info_fd(int fd, const char* path, ShardInfo* info) {
    struct stat st;
    if (fstat(fd, &st) != 0) { fail(EXIT_BADFILE, "cannot stat '%s': %s", path, strerror(errno)); }
    if (st.st_size < SHARD_HEADER_BYTES) {
        fail(EXIT_BADFILE, "%s: file is truncated (%lld bytes, a shard header alone has %d)", path, (long long)st.st_size,
             SHARD_HEADER_BYTES);
    }
    int32_t h[SHARD_HEADER_INTS];
    pread_full(fd, h, SHARD_HEADER_BYTES, 0, path);
    shard_header_parse(h, path, (long long)st.st_size, info);
}

static void shard_info(const char* path, ShardInfo* info) {
    int fd = shard_open_fd(path);
    shard_info_fd(fd, path, info);
    close(fd);
}

// tokens [start, start + n) of the shard, widened to uint32
static void shard_read_tokens(int fd, const char* path, const ShardInfo* info, uint64_t start, size_t n, uint32_t* out) {
    if (start + n > info->count) { fail(EXIT_BADFILE, "%s: read past the last token (internal error)", path); }
    off_t off = (off_t)SHARD_HEADER_BYTES + (off_t)start * info->tok_bytes;
    if (info->tok_bytes == 4) { pread_full(fd, out, n * 4, off, path); return; }
    uint16_t* tmp = (uint16_t*)out + n;   // read into the upper half, widen from the front (never overlaps)
    pread_full(fd, tmp, n * 2, off, path);
    for (size_t i = 0; i < n; i++) { out[i] = tmp[i]; }
}

static int* shard_read_all(const char* path, ShardInfo* info) {
    int fd = shard_open_fd(path);
    shard_info_fd(fd, path, info);
    uint32_t* buf = (uint32_t*)mallocCheck((size_t)info->count * sizeof(uint32_t));
    shard_read_tokens(fd, path, info, 0, (size_t)info->count, buf);
    close(fd);
    return (int*)buf;
}

// ---- writer: tokens stream to path.tmp; close writes the final count into the header and renames

typedef struct {
    AtomicFile af;
    int tok_bytes;
    uint64_t count;
    uint8_t buf[1 << 16];
    size_t nbuf;
} ShardWriter;

static void shard_writer_open(ShardWriter* w, const char* path, int tok_bytes) {
    if (tok_bytes != 2 && tok_bytes != 4) { fail(EXIT_USAGE, "shard tokens are 2 or 4 bytes, not %d", tok_bytes); }
    atomic_open(&w->af, path);
    w->tok_bytes = tok_bytes;
    w->count = 0;
    w->nbuf = 0;
    int32_t h[SHARD_HEADER_INTS];
    shard_header_make(h, tok_bytes, 0);
    fwriteCheck(h, 1, SHARD_HEADER_BYTES, w->af.f);
}

static void shard_writer_put(ShardWriter* w, const int* ids, size_t n) {
    uint32_t limit = w->tok_bytes == 2 ? 0xFFFFu : 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || (uint32_t)ids[i] > limit) {
            fail(EXIT_USAGE, "token id %d does not fit a %s shard\n  hint: use uint32 tokens", ids[i],
                 w->tok_bytes == 2 ? "uint16" : "uint32");
        }
        if (w->nbuf + (size_t)w->tok_bytes > sizeof(w->buf)) { fwriteCheck(w->buf, 1, w->nbuf, w->af.f); w->nbuf = 0; }
        if (w->tok_bytes == 2) { uint16_t v = (uint16_t)ids[i]; memcpy(w->buf + w->nbuf, &v, 2); }
        else { uint32_t v = (uint32_t)ids[i]; memcpy(w->buf + w->nbuf, &v, 4); }
        w->nbuf += (size_t)w->tok_bytes;
    }
    w->count += n;
}

static void shard_writer_close(ShardWriter* w) {
    fwriteCheck(w->buf, 1, w->nbuf, w->af.f);
    int32_t h[SHARD_HEADER_INTS];
    shard_header_make(h, w->tok_bytes, w->count);
    if (fseeko(w->af.f, 0, SEEK_SET) != 0) { fail(EXIT_SYSTEM, "cannot seek in '%s': %s", w->af.tmp, strerror(errno)); }
    fwriteCheck(h, 1, SHARD_HEADER_BYTES, w->af.f);
    atomic_commit(&w->af);
}

static void shard_write(const char* path, int tok_bytes, const int* ids, size_t n) {
    ShardWriter* w = (ShardWriter*)mallocCheck(sizeof(ShardWriter));
    shard_writer_open(w, path, tok_bytes);
    shard_writer_put(w, ids, n);
    shard_writer_close(w);
    free(w);
}

#endif // PDN_SHARD_H
