/* gguf: GGUF v2/v3 reader over a read-only mapping.
 *
 * Layout (little-endian): magic "GGUF", u32 version, u64 n_tensors, u64 n_kv, then n_kv
 * metadata entries (string key, u32 type, value), then n_tensors tensor infos (string
 * name, u32 n_dims, u64 ne[n_dims], u32 type, u64 offset), then padding up to
 * general.alignment, then the tensor data section.
 *
 * The file is outside input: every count and length is compared with the bytes left
 * before it is used, and arithmetic on file values is done so it cannot wrap. Nothing
 * here trusts a pointer it has not bounds-checked, and a bad file only ever returns a
 * negative code with a message in f->err. */
#include "core/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/cpu/quant.h"

#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_ARR_DEPTH 4 /* array nesting accepted: arr, arr of arr, ... 4 levels */
#define GGUF_HEADER_BYTES 24 /* magic 4, version 4, n_tensors 8, n_kv 8 */
/* Smallest possible encodings; they bound counts (and so allocations) by file size. */
#define GGUF_MIN_KV_BYTES 13     /* key length 8 + type 4 + a one-byte value */
#define GGUF_MIN_TENSOR_BYTES 32 /* name length 8 + n_dims 4 + one ne 8 + type 4 + offset 8 */
#define GGUF_MIN_STR_BYTES 8     /* the u64 length alone */
#define GGUF_MIN_ARR_BYTES 12    /* element type 4 + count 8 */
#define GGUF_SHOW_MAX 64         /* bytes of a name quoted in a message */

typedef unsigned long long ull; /* for printf of u64 without PRIu64 noise */

/* ---------------------------------------------------------------- messages */

static int vfail(gguf_file *f, int code, const char *ctx, const char *fmt, va_list ap) {
    char msg[sizeof f->err];
    vsnprintf(msg, sizeof msg, fmt, ap);
    /* Truncation is acceptable for a message; the check only quiets -Wformat-truncation. */
    if (snprintf(f->err, sizeof f->err, "gguf: %s%s%s", ctx ? ctx : "", ctx ? ": " : "", msg) < 0)
        f->err[0] = 0;
    return code;
}

static int fail(gguf_file *f, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfail(f, code, NULL, fmt, ap);
    va_end(ap);
    return code;
}

/* A name from the file, made safe to print: it may hold any bytes and no NUL. */
typedef struct {
    char s[GGUF_SHOW_MAX + 4];
} shown;

static shown show(gguf_str str) {
    shown out;
    size_t n = str.len < GGUF_SHOW_MAX ? (size_t)str.len : GGUF_SHOW_MAX;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)str.ptr[i];
        out.s[i] = (ch >= 0x20 && ch < 0x7f) ? (char)ch : '?';
    }
    strcpy(out.s + n, str.len > n ? "..." : "");
    return out;
}

/* ---------------------------------------------------------------- cursor */

typedef struct {
    gguf_file *f;
    const uint8_t *p;
    size_t size, pos;
    char ctx[128]; /* what is being read, for messages: "key 'x'", "tensor 3 'y'" */
} cursor;

static size_t left(const cursor *c) { return c->size - c->pos; }

static int cfail(cursor *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfail(c->f, -EINVAL, c->ctx[0] ? c->ctx : NULL, fmt, ap);
    va_end(ap);
    return -EINVAL;
}

static uint64_t le(const uint8_t *p, int bytes) {
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static int take(cursor *c, uint64_t n, const char *what, const uint8_t **out) {
    if (n > left(c))
        return cfail(c, "%s at offset %zu needs %llu bytes but only %zu are left (truncated file?)",
                     what, c->pos, (ull)n, left(c));
    if (out) *out = c->p + c->pos;
    c->pos += (size_t)n;
    return 0;
}

static int rd_u32(cursor *c, uint32_t *v, const char *what) {
    const uint8_t *p = NULL;
    int rc = take(c, 4, what, &p);
    if (!rc) *v = (uint32_t)le(p, 4);
    return rc;
}

static int rd_u64(cursor *c, uint64_t *v, const char *what) {
    const uint8_t *p = NULL;
    int rc = take(c, 8, what, &p);
    if (!rc) *v = le(p, 8);
    return rc;
}

static int rd_str(cursor *c, gguf_str *s, const char *what) {
    uint64_t len;
    int rc = rd_u64(c, &len, what);
    if (rc) return rc;
    if (len > left(c))
        return cfail(c, "%s: length %llu at offset %zu exceeds the %zu bytes left", what, (ull)len,
                     c->pos - 8, left(c));
    s->ptr = (const char *)c->p + c->pos;
    s->len = len;
    c->pos += (size_t)len;
    return 0;
}

/* ---------------------------------------------------------------- metadata values */

static size_t scalar_size(uint32_t type) {
    switch (type) {
    case GGUF_U8:
    case GGUF_I8:
    case GGUF_BOOL: return 1;
    case GGUF_U16:
    case GGUF_I16: return 2;
    case GGUF_U32:
    case GGUF_I32:
    case GGUF_F32: return 4;
    case GGUF_U64:
    case GGUF_I64:
    case GGUF_F64: return 8;
    default: return 0; /* strings, arrays and unknown types have no fixed size */
    }
}

static int skip_array(cursor *c, uint32_t et, uint64_t n, int depth);

/* Element count n of an array whose elements take at least `min` bytes each: refuse
 * counts the rest of the file cannot hold before looping or multiplying. */
static int check_count(cursor *c, uint64_t n, size_t min, const char *kind) {
    if (n > left(c) / min)
        return cfail(c, "array of %llu %s at offset %zu cannot fit in the %zu bytes left", (ull)n,
                     kind, c->pos, left(c));
    return 0;
}

static int skip_array_header(cursor *c, int depth) {
    uint32_t et;
    uint64_t n;
    int rc = rd_u32(c, &et, "array element type");
    if (!rc) rc = rd_u64(c, &n, "array length");
    if (!rc) rc = skip_array(c, et, n, depth);
    return rc;
}

static int skip_array(cursor *c, uint32_t et, uint64_t n, int depth) {
    if (depth > GGUF_MAX_ARR_DEPTH)
        return cfail(c, "arrays nested deeper than %d levels", GGUF_MAX_ARR_DEPTH);
    size_t es = scalar_size(et);
    int rc = 0;
    if (es) {
        rc = check_count(c, n, es, "fixed-size elements");
        if (!rc) rc = take(c, n * es, "array data", NULL); /* n * es <= left: no wrap */
    } else if (et == GGUF_STR) {
        rc = check_count(c, n, GGUF_MIN_STR_BYTES, "strings");
        for (uint64_t i = 0; i < n && !rc; i++) {
            gguf_str s;
            rc = rd_str(c, &s, "array string");
        }
    } else if (et == GGUF_ARR) {
        rc = check_count(c, n, GGUF_MIN_ARR_BYTES, "arrays");
        for (uint64_t i = 0; i < n && !rc; i++)
            rc = skip_array_header(c, depth + 1);
    } else {
        rc = cfail(c, "unknown array element type %u", et);
    }
    return rc;
}

static int parse_kv(cursor *c, gguf_kv *kv, uint64_t idx) {
    snprintf(c->ctx, sizeof c->ctx, "metadata entry %llu", (ull)idx);
    int rc = rd_str(c, &kv->key, "key");
    if (!rc) {
        snprintf(c->ctx, sizeof c->ctx, "key '%s'", show(kv->key).s);
        rc = rd_u32(c, &kv->type, "value type");
    }
    if (rc) return rc;
    size_t start = c->pos;
    if (kv->type == GGUF_ARR) {
        rc = rd_u32(c, &kv->arr_type, "array element type");
        if (!rc) rc = rd_u64(c, &kv->arr_n, "array length");
        start = c->pos; /* val points at the first element */
        if (!rc) rc = skip_array(c, kv->arr_type, kv->arr_n, 1);
    } else if (kv->type == GGUF_STR) {
        gguf_str s;
        rc = rd_str(c, &s, "string value"); /* val keeps the u64 length prefix */
    } else if (scalar_size(kv->type)) {
        rc = take(c, scalar_size(kv->type), "value", NULL);
    } else {
        rc = cfail(c, "unknown value type %u", kv->type);
    }
    kv->val = c->p + start;
    kv->val_size = c->pos - start;
    return rc;
}

/* ---------------------------------------------------------------- sorting helpers */

static int str_cmp(gguf_str a, gguf_str b) {
    size_t n = a.len < b.len ? (size_t)a.len : (size_t)b.len;
    int r = n ? memcmp(a.ptr, b.ptr, n) : 0;
    if (r) return r;
    return (a.len > b.len) - (a.len < b.len);
}

static int kv_key_cmp(const void *a, const void *b) {
    return str_cmp((*(const gguf_kv *const *)a)->key, (*(const gguf_kv *const *)b)->key);
}

static int tensor_name_cmp(const void *a, const void *b) {
    return str_cmp((*(const gguf_tensor *const *)a)->name, (*(const gguf_tensor *const *)b)->name);
}

/* By offset, then size, so a zero-size tensor sorts before a sized one at its offset. */
static int tensor_off_cmp(const void *a, const void *b) {
    const gguf_tensor *x = *(const gguf_tensor *const *)a, *y = *(const gguf_tensor *const *)b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    return (x->size > y->size) - (x->size < y->size);
}

/* ---------------------------------------------------------------- header and metadata */

static int parse_header(cursor *c) {
    gguf_file *f = c->f;
    const uint8_t *m = NULL;
    if (c->size < GGUF_HEADER_BYTES)
        return fail(f, -EINVAL, "file is %zu bytes, too small for a GGUF header (%d bytes)",
                    c->size, GGUF_HEADER_BYTES);
    take(c, 4, "magic", &m);
    if (memcmp(m, "GGUF", 4))
        return fail(f, -EINVAL, "not a GGUF file (magic %02x %02x %02x %02x, expected \"GGUF\")",
                    m[0], m[1], m[2], m[3]);
    rd_u32(c, &f->version, "version");
    rd_u64(c, &f->n_tensors, "tensor count");
    rd_u64(c, &f->n_kv, "metadata count");
    uint32_t v = f->version;
    if (v == 1)
        return fail(f, -EINVAL,
                    "GGUF version 1 is not supported (only v2 and v3); "
                    "re-convert the model with a current llama.cpp");
    if (v == 0x02000000u || v == 0x03000000u)
        return fail(f, -EINVAL, "big-endian GGUF is not supported; use a little-endian file");
    if (v != 2 && v != 3)
        return fail(f, -EINVAL, "unsupported GGUF version %u (expected 2 or 3)", v);
    /* Bound both counts by what the rest of the file could hold, before allocating. */
    size_t rest = left(c);
    if (f->n_kv > rest / GGUF_MIN_KV_BYTES)
        return fail(f, -EINVAL, "header claims %llu metadata entries but only %zu bytes follow",
                    (ull)f->n_kv, rest);
    rest -= (size_t)f->n_kv * GGUF_MIN_KV_BYTES;
    if (f->n_tensors > rest / GGUF_MIN_TENSOR_BYTES)
        return fail(f, -EINVAL,
                    "header claims %llu tensors but the file is too small to describe them",
                    (ull)f->n_tensors);
    return 0;
}

static int check_dup_keys(gguf_file *f) {
    if (f->n_kv < 2) return 0;
    const gguf_kv **idx = malloc((size_t)f->n_kv * sizeof *idx);
    if (!idx) return fail(f, -ENOMEM, "out of memory sorting %llu keys", (ull)f->n_kv);
    for (uint64_t i = 0; i < f->n_kv; i++)
        idx[i] = &f->kv[i];
    qsort(idx, (size_t)f->n_kv, sizeof *idx, kv_key_cmp);
    int rc = 0;
    for (uint64_t i = 1; i < f->n_kv && !rc; i++)
        if (!str_cmp(idx[i - 1]->key, idx[i]->key))
            rc = fail(f, -EINVAL, "duplicate metadata key '%s'", show(idx[i]->key).s);
    free(idx);
    return rc;
}

static int parse_kvs(cursor *c) {
    gguf_file *f = c->f;
    if (f->n_kv) {
        f->kv = calloc((size_t)f->n_kv, sizeof *f->kv); /* n_kv bounded by parse_header */
        if (!f->kv)
            return fail(f, -ENOMEM, "out of memory for %llu metadata entries", (ull)f->n_kv);
    }
    for (uint64_t i = 0; i < f->n_kv; i++) {
        int rc = parse_kv(c, &f->kv[i], i);
        if (rc) return rc;
    }
    c->ctx[0] = 0;
    return check_dup_keys(f);
}

static int read_alignment(gguf_file *f) {
    const gguf_kv *kv = gguf_find(f, "general.alignment");
    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    if (!kv) return 0;
    if (kv->type != GGUF_U32)
        return fail(f, -EINVAL, "general.alignment has value type %u, expected u32 (%d)", kv->type,
                    GGUF_U32);
    uint32_t a = (uint32_t)le(kv->val, 4);
    if (a == 0 || (a & (a - 1)))
        return fail(f, -EINVAL, "general.alignment %u is not a nonzero power of two", a);
    f->alignment = a;
    return 0;
}

/* ---------------------------------------------------------------- tensor infos */

/* Product of ne[from..3] into *out, refusing any product above INT64_MAX. */
static int shape_product(const gguf_tensor *t, int from, int64_t *out) {
    int64_t n = 1;
    for (int d = from; d < GGUF_MAX_DIMS; d++) {
        if (t->ne[d] != 0 && n > INT64_MAX / t->ne[d]) return -1;
        n *= t->ne[d];
    }
    *out = n;
    return 0;
}

static int tensor_size(gguf_file *f, gguf_tensor *t) {
    shown shown_name = show(t->name);
    const char *nm = shown_name.s;
    const quant_traits *q = quant_traits_of(t->type);
    if (!q) {
        const char *tn = quant_type_name(t->type);
        return tn ? fail(f, -ENOTSUP, "tensor '%s' has type %s (%u), which kiln does not support", nm, tn, t->type)
                  : fail(f, -EINVAL, "tensor '%s' has unknown type %u", nm, t->type);
    }
    int64_t all, rows;
    if (shape_product(t, 0, &all) || shape_product(t, 1, &rows))
        return fail(f, -EINVAL, "tensor '%s' shape [%lld, %lld, %lld, %lld] overflows int64", nm,
                    (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                    (long long)t->ne[3]);
    if (t->ne[0] % q->block)
        return fail(f, -EINVAL,
                    "tensor '%s' (%s) row length %lld is not a multiple of its block size %d", nm,
                    q->name, (long long)t->ne[0], q->block);
    uint64_t nblocks = (uint64_t)(t->ne[0] / q->block);
    if (q->bytes && nblocks > UINT64_MAX / q->bytes)
        return fail(f, -EINVAL, "tensor '%s' row of %lld %s elements overflows its byte size", nm,
                    (long long)t->ne[0], q->name);
    /* quant_row_size works in size_t; insist it agrees with the checked 64-bit product. */
    uint64_t row = nblocks * q->bytes;
    if (t->ne[0] && (uint64_t)quant_row_size(t->type, t->ne[0]) != row)
        return fail(f, -EINVAL, "tensor '%s': row of %lld %s elements has no usable byte size", nm,
                    (long long)t->ne[0], q->name);
    if (row && (uint64_t)rows > UINT64_MAX / row)
        return fail(f, -EINVAL, "tensor '%s' byte size overflows (row %llu bytes x %lld rows)", nm,
                    (ull)row, (long long)rows);
    t->size = row * (uint64_t)rows;
    return 0;
}

static int parse_tensor_info(cursor *c, gguf_tensor *t, uint64_t idx) {
    snprintf(c->ctx, sizeof c->ctx, "tensor info %llu", (ull)idx);
    int rc = rd_str(c, &t->name, "tensor name");
    if (!rc) {
        snprintf(c->ctx, sizeof c->ctx, "tensor '%s'", show(t->name).s);
        rc = rd_u32(c, &t->n_dims, "n_dims");
    }
    if (rc) return rc;
    if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS)
        return cfail(c, "n_dims is %u (expected 1..%d)", t->n_dims, GGUF_MAX_DIMS);
    for (int d = 0; d < GGUF_MAX_DIMS; d++)
        t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        uint64_t ne;
        if ((rc = rd_u64(c, &ne, "dimension"))) return rc;
        if (ne > (uint64_t)INT64_MAX)
            return cfail(c, "dimension %u is %lld (negative)", d, (long long)(int64_t)ne);
        t->ne[d] = (int64_t)ne;
    }
    if ((rc = rd_u32(c, &t->type, "type")) || (rc = rd_u64(c, &t->offset, "data offset")))
        return rc;
    if (t->offset % c->f->alignment)
        return cfail(c, "data offset %llu is not a multiple of the alignment %u", (ull)t->offset,
                     c->f->alignment);
    return tensor_size(c->f, t);
}

/* The data section starts at the first aligned offset after the tensor infos. */
static int place_data(cursor *c) {
    gguf_file *f = c->f;
    size_t pad = (f->alignment - c->pos % f->alignment) % f->alignment;
    if (pad > left(c)) {
        if (f->n_tensors)
            return fail(f, -EINVAL,
                        "data section would start at offset %llu, past end of file (size %zu)",
                        (ull)c->pos + pad, c->size);
        f->data_offset = c->size; /* no tensors: a missing tail pad is harmless */
        return 0;
    }
    f->data_offset = c->pos + pad;
    return 0;
}

static int check_tensor_data(gguf_file *f) {
    size_t avail = f->size - f->data_offset;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        gguf_tensor *t = &f->tensors[i];
        if (t->offset > avail || t->size > avail - t->offset)
            return fail(f, -EINVAL,
                        "tensor '%s' data [off %llu, size %llu] runs past end of file "
                        "(data section at %zu holds %zu bytes; file size %zu)",
                        show(t->name).s, (ull)t->offset, (ull)t->size, f->data_offset, avail,
                        f->size);
        t->data = f->base + f->data_offset + t->offset;
    }
    return 0;
}

/* Duplicate names and overlapping data, found by sorting a temporary index. */
static int check_tensor_set(gguf_file *f) {
    uint64_t n = f->n_tensors;
    if (n < 2) return 0;
    const gguf_tensor **idx = malloc((size_t)n * sizeof *idx);
    if (!idx) return fail(f, -ENOMEM, "out of memory sorting %llu tensors", (ull)n);
    for (uint64_t i = 0; i < n; i++)
        idx[i] = &f->tensors[i];
    int rc = 0;
    qsort(idx, (size_t)n, sizeof *idx, tensor_name_cmp);
    for (uint64_t i = 1; i < n && !rc; i++)
        if (!str_cmp(idx[i - 1]->name, idx[i]->name))
            rc = fail(f, -EINVAL, "duplicate tensor name '%s'", show(idx[i]->name).s);
    if (!rc) qsort(idx, (size_t)n, sizeof *idx, tensor_off_cmp);
    for (uint64_t i = 1; i < n && !rc; i++) {
        const gguf_tensor *a = idx[i - 1], *b = idx[i];
        if (a->size > b->offset - a->offset) /* both in bounds and sorted: no wrap */
            rc = fail(f, -EINVAL,
                      "tensors '%s' [off %llu, size %llu] and '%s' [off %llu, size %llu] overlap",
                      show(a->name).s, (ull)a->offset, (ull)a->size, show(b->name).s,
                      (ull)b->offset, (ull)b->size);
    }
    free(idx);
    return rc;
}

static int parse_tensors(cursor *c) {
    gguf_file *f = c->f;
    if (f->n_tensors) {
        f->tensors = calloc((size_t)f->n_tensors, sizeof *f->tensors); /* bounded by parse_header */
        if (!f->tensors)
            return fail(f, -ENOMEM, "out of memory for %llu tensor infos", (ull)f->n_tensors);
    }
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        int rc = parse_tensor_info(c, &f->tensors[i], i);
        if (rc) return rc;
    }
    c->ctx[0] = 0;
    int rc = place_data(c);
    if (!rc) rc = check_tensor_data(f);
    if (!rc) rc = check_tensor_set(f);
    return rc;
}

static int parse(gguf_file *f) {
    cursor c = {.f = f, .p = f->base, .size = f->size};
    int rc = parse_header(&c);
    if (!rc) rc = parse_kvs(&c);
    if (!rc) rc = read_alignment(f);
    if (!rc) rc = parse_tensors(&c);
    return rc;
}

/* ---------------------------------------------------------------- open and close */

static void reset(gguf_file *f) {
    memset(f, 0, sizeof *f);
    f->fd = -1;
}

/* Frees everything but keeps f->err, so a failed open can still be reported. */
static void release(gguf_file *f) {
    char err[sizeof f->err];
    memcpy(err, f->err, sizeof err);
    free(f->kv);
    free(f->tensors);
    if (f->mapped) {
        munmap((void *)f->base, f->size);
        if (f->fd >= 0) close(f->fd);
    }
    reset(f);
    memcpy(f->err, err, sizeof err);
}

void gguf_close(gguf_file *f) {
    if (!f) return;
    release(f);
    f->err[0] = 0;
}

int gguf_open_mem(gguf_file *f, const void *buf, size_t size) {
    reset(f);
    if (!buf && size) return fail(f, -EINVAL, "NULL buffer of %zu bytes", size);
    f->base = buf;
    f->size = size;
    int rc = parse(f);
    if (rc) release(f);
    return rc;
}

/* Puts the path in front of a parse message: "gguf: <path>: <what>". */
static void name_path(gguf_file *f, const char *path) {
    char msg[sizeof f->err];
    const char *body = strncmp(f->err, "gguf: ", 6) ? f->err : f->err + 6;
    if (snprintf(msg, sizeof msg, "gguf: %s: %s", path, body) < 0) return;
    memcpy(f->err, msg, sizeof msg);
}

static int map_file(gguf_file *f, const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return fail(f, -e, "%s: cannot open: %s", path, strerror(e));
    }
    f->fd = fd;
    struct stat st;
    if (fstat(fd, &st)) {
        int e = errno;
        close(fd);
        f->fd = -1;
        return fail(f, -e, "%s: fstat: %s", path, strerror(e));
    }
    int rc = 0;
    if (!S_ISREG(st.st_mode))
        rc = fail(f, -EINVAL, "%s: not a regular file", path);
    else if (st.st_size < GGUF_HEADER_BYTES)
        rc = fail(f, -EINVAL, "%s: file is %lld bytes, too small for a GGUF header", path,
                  (long long)st.st_size);
    else if ((uint64_t)st.st_size > SIZE_MAX)
        rc = fail(f, -EFBIG, "%s: file too large to map", path);
    if (!rc) {
        void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            int e = errno;
            rc =
                fail(f, -e, "%s: mmap of %lld bytes: %s", path, (long long)st.st_size, strerror(e));
        } else {
            f->base = m;
            f->size = (size_t)st.st_size;
            f->mapped = 1;
        }
    }
    if (rc) {
        close(fd);
        f->fd = -1;
    }
    return rc;
}

int gguf_open(gguf_file *f, const char *path) {
    reset(f);
    int rc = map_file(f, path);
    if (!rc) {
        rc = parse(f);
        if (rc) name_path(f, path);
    }
    if (rc) release(f);
    return rc;
}

/* ---------------------------------------------------------------- lookups */

int gguf_str_eq(gguf_str s, const char *c) {
    if (!c || !s.ptr) return 0;
    size_t n = strlen(c);
    return s.len == n && memcmp(s.ptr, c, n) == 0;
}

const gguf_kv *gguf_find(const gguf_file *f, const char *key) {
    for (uint64_t i = 0; f && i < f->n_kv; i++)
        if (gguf_str_eq(f->kv[i].key, key)) return &f->kv[i];
    return NULL;
}

const gguf_tensor *gguf_tensor_find(const gguf_file *f, const char *name) {
    for (uint64_t i = 0; f && i < f->n_tensors; i++)
        if (gguf_str_eq(f->tensors[i].name, name)) return &f->tensors[i];
    return NULL;
}

/* An integer value of any width and signedness, as sign and magnitude. */
typedef struct {
    int ok, neg;
    uint64_t mag;
} intval;

static intval int_of(uint32_t type, const uint8_t *p) {
    intval v = {0, 0, 0};
    int sign;
    switch (type) {
    case GGUF_U8:
    case GGUF_U16:
    case GGUF_U32:
    case GGUF_U64: sign = 0; break;
    case GGUF_I8:
    case GGUF_I16:
    case GGUF_I32:
    case GGUF_I64: sign = 1; break;
    default: return v;
    }
    int bytes = (int)scalar_size(type), bits = bytes * 8;
    uint64_t x = le(p, bytes);
    uint64_t mask = bits == 64 ? UINT64_MAX : (UINT64_C(1) << bits) - 1;
    v.ok = 1;
    v.neg = sign && (x >> (bits - 1)) & 1;
    v.mag = v.neg ? ((~x & mask) + 1) : x;
    return v;
}

int gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out) {
    const gguf_kv *kv = gguf_find(f, key);
    if (!kv) return -ENOENT;
    intval v = int_of(kv->type, kv->val);
    if (!v.ok) return -EINVAL;
    if (v.neg || v.mag > UINT32_MAX) return -ERANGE;
    *out = (uint32_t)v.mag;
    return 0;
}

static int float_of(uint32_t type, const uint8_t *p, float *out) {
    if (type == GGUF_F32) {
        uint32_t b = (uint32_t)le(p, 4);
        memcpy(out, &b, 4);
    } else if (type == GGUF_F64) {
        uint64_t b = le(p, 8);
        double d;
        memcpy(&d, &b, 8);
        *out = (float)d;
    } else {
        return -EINVAL;
    }
    return 0;
}

int gguf_get_f32(const gguf_file *f, const char *key, float *out) {
    const gguf_kv *kv = gguf_find(f, key);
    return kv ? float_of(kv->type, kv->val, out) : -ENOENT;
}

int gguf_get_bool(const gguf_file *f, const char *key, int *out) {
    const gguf_kv *kv = gguf_find(f, key);
    if (!kv) return -ENOENT;
    if (kv->type != GGUF_BOOL) return -EINVAL;
    *out = kv->val[0] != 0;
    return 0;
}

int gguf_get_str(const gguf_file *f, const char *key, gguf_str *out) {
    const gguf_kv *kv = gguf_find(f, key);
    if (!kv) return -ENOENT;
    if (kv->type != GGUF_STR) return -EINVAL;
    out->len = le(kv->val, 8); /* checked against the file by parse_kv */
    out->ptr = (const char *)kv->val + 8;
    return 0;
}

int gguf_arr_strs(const gguf_file *f, const gguf_kv *kv, gguf_str *out, uint64_t n) {
    if (!kv || kv->type != GGUF_ARR || kv->arr_type != GGUF_STR) return -EINVAL;
    if (n > kv->arr_n) return -ERANGE;
    /* kv must come from f: its span lies inside the mapping, so the walk stays in it. */
    uintptr_t at = (uintptr_t)kv->val, lo = f ? (uintptr_t)f->base : 0;
    if (!f || at < lo || at - lo > f->size || kv->val_size > f->size - (at - lo)) return -EINVAL;
    const uint8_t *p = kv->val, *end = kv->val + kv->val_size;
    for (uint64_t i = 0; i < n; i++) {
        if (end - p < GGUF_MIN_STR_BYTES) return -EINVAL;
        uint64_t len = le(p, 8);
        p += 8;
        if (len > (uint64_t)(end - p)) return -EINVAL;
        out[i].ptr = (const char *)p;
        out[i].len = len;
        p += len;
    }
    return 0;
}

/* Element i of a numeric array into *p: -EINVAL if kv is not one, -ERANGE if i is past it. */
static int arr_elem(const gguf_kv *kv, uint64_t i, const uint8_t **p) {
    size_t es = kv ? scalar_size(kv->arr_type) : 0;
    if (!kv || kv->type != GGUF_ARR || !es || kv->val_size / es < kv->arr_n) return -EINVAL;
    if (i >= kv->arr_n) return -ERANGE;
    *p = kv->val + i * es;
    return 0;
}

int gguf_arr_i32(const gguf_kv *kv, uint64_t i, int32_t *out) {
    const uint8_t *p = NULL;
    int rc = arr_elem(kv, i, &p);
    if (rc) return rc;
    intval v = int_of(kv->arr_type, p);
    if (!v.ok) return -EINVAL;
    if (v.neg ? v.mag > (uint64_t)INT32_MAX + 1 : v.mag > INT32_MAX) return -ERANGE;
    *out = v.neg ? (int32_t)(-(int64_t)v.mag) : (int32_t)v.mag;
    return 0;
}

int gguf_arr_f32(const gguf_kv *kv, uint64_t i, float *out) {
    const uint8_t *p = NULL;
    int rc = arr_elem(kv, i, &p);
    return rc ? rc : float_of(kv->arr_type, p, out);
}
