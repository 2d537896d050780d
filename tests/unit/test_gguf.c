/* test_gguf: the GGUF reader on the real model, then on a corpus of malformed files
 * built here byte by byte. Every malformed file must give a negative code and a
 * message, never a crash; the ASan+UBSan build of this program proves the latter. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/gguf.h"
#include "core/cpu/quant.h"
#include "tests/unit/check.h"

/* ---------------------------------------------------------------- the real model */

static void test_model(const char *path) {
    if (access(path, R_OK)) {
        fprintf(stderr, "test_gguf: model %s not found (run `make model` or set MODEL)\n", path);
        CHECK(0, "model file %s is missing", path);
        return;
    }
    gguf_file f;
    int rc = gguf_open(&f, path);
    CHECK(rc == 0, "gguf_open(%s) = %d: %s", path, rc, f.err);
    if (rc) return;
    CHECK(f.version == 3, "version %u", f.version);
    CHECK(f.n_tensors == 272, "n_tensors %llu", (unsigned long long)f.n_tensors);
    CHECK(f.n_kv == 33, "n_kv %llu", (unsigned long long)f.n_kv);
    CHECK(f.alignment == 32, "alignment %u", f.alignment);
    CHECK(f.data_offset == 1785664, "data_offset %zu", f.data_offset);

    uint32_t u = 0;
    CHECK(gguf_get_u32(&f, "llama.block_count", &u) == 0 && u == 30, "block_count %u", u);
    CHECK(gguf_get_u32(&f, "llama.embedding_length", &u) == 0 && u == 576, "embd %u", u);
    CHECK(gguf_get_u32(&f, "llama.attention.head_count_kv", &u) == 0 && u == 3, "kv heads %u", u);
    CHECK(gguf_get_u32(&f, "tokenizer.ggml.eos_token_id", &u) == 0 && u == 2, "eos %u", u);
    CHECK(gguf_get_u32(&f, "no.such.key", &u) == -ENOENT, "absent key");
    CHECK(gguf_get_u32(&f, "general.architecture", &u) == -EINVAL, "string as u32");
    float x = 0;
    CHECK(gguf_get_f32(&f, "llama.rope.freq_base", &x) == 0 && x == 100000.0f, "freq_base %g", x);
    CHECK(gguf_get_f32(&f, "llama.attention.layer_norm_rms_epsilon", &x) == 0 &&
              fabsf(x - 1e-5f) < 1e-9f,
          "rms eps %g", x);
    int b = -1;
    CHECK(gguf_get_bool(&f, "tokenizer.ggml.add_bos_token", &b) == 0 && b == 0, "add_bos %d", b);
    gguf_str s = {0};
    CHECK(gguf_get_str(&f, "tokenizer.ggml.model", &s) == 0 && gguf_str_eq(s, "gpt2"), "tok model");
    CHECK(gguf_get_str(&f, "general.architecture", &s) == 0 && gguf_str_eq(s, "llama"), "arch");

    const gguf_kv *tok = gguf_find(&f, "tokenizer.ggml.tokens");
    CHECK(tok && tok->type == GGUF_ARR && tok->arr_type == GGUF_STR && tok->arr_n == 49152,
          "tokens array");
    if (tok && tok->arr_n == 49152) {
        gguf_str *all = malloc(49152 * sizeof *all);
        CHECK(all && gguf_arr_strs(&f, tok, all, 49152) == 0, "read all tokens");
        if (all) {
            CHECK(gguf_str_eq(all[0], "<|endoftext|>"), "token 0 '%.*s'", (int)all[0].len,
                  all[0].ptr);
            CHECK(gguf_str_eq(all[49151], "ectable"), "last token");
        }
        free(all);
        CHECK(gguf_arr_strs(&f, tok, &s, 0) == 0, "zero strings");
        CHECK(gguf_arr_strs(&f, tok, NULL, 49153) == -ERANGE, "too many strings");
    }
    const gguf_kv *mg = gguf_find(&f, "tokenizer.ggml.merges");
    CHECK(mg && mg->arr_n == 48900, "merges count");
    if (mg && mg->arr_n) {
        CHECK(gguf_arr_strs(&f, mg, &s, 1) == 0 && gguf_str_eq(s, "\xc4\xa0 t"), "merge 0");
    }
    const gguf_kv *tt = gguf_find(&f, "tokenizer.ggml.token_type");
    int32_t v = 0;
    CHECK(tt && tt->arr_type == GGUF_I32 && tt->arr_n == 49152, "token_type");
    CHECK(gguf_arr_i32(tt, 0, &v) == 0 && v == 3, "token_type[0] %d", v); /* control */
    CHECK(gguf_arr_i32(tt, 49152, &v) == -ERANGE, "token_type out of range");
    CHECK(gguf_arr_i32(tok, 0, &v) == -EINVAL, "string array as i32");

    const gguf_tensor *t = gguf_tensor_find(&f, "token_embd.weight");
    CHECK(t != NULL, "token_embd.weight present");
    if (t) {
        CHECK(t->type == QT_Q8_0, "token_embd type %u", t->type);
        CHECK(t->n_dims == 2 && t->ne[0] == 576 && t->ne[1] == 49152 && t->ne[2] == 1 &&
                  t->ne[3] == 1,
              "token_embd ne");
        CHECK(t->size == 30081024, "token_embd size %llu", (unsigned long long)t->size);
        CHECK(t->data == f.base + f.data_offset + t->offset, "token_embd data pointer");
    }
    t = gguf_tensor_find(&f, "blk.0.ffn_down.weight");
    CHECK(t && t->type == QT_Q4_1 && t->ne[0] == 1536 && t->ne[1] == 576 && t->size == 552960,
          "ffn_down");
    t = gguf_tensor_find(&f, "blk.29.attn_norm.weight");
    CHECK(t && t->type == QT_F32 && t->n_dims == 1 && t->ne[0] == 576 && t->size == 2304, "norm");
    CHECK(gguf_tensor_find(&f, "blk.30.attn_norm.weight") == NULL, "no layer 30");

    uint64_t total = 0;
    for (uint64_t i = 0; i < f.n_tensors; i++)
        total += f.tensors[i].size;
    CHECK(total <= f.size - f.data_offset, "tensor bytes %llu fit", (unsigned long long)total);
    gguf_close(&f);
    CHECK(f.kv == NULL && f.tensors == NULL && f.base == NULL, "closed");
    gguf_close(&f); /* twice is harmless */
}

/* ---------------------------------------------------------------- a GGUF builder */

typedef struct {
    uint8_t *b;
    size_t n, cap;
} buf;

static void put(buf *b, const void *p, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->b = realloc(b->b, b->cap);
        if (!b->b) abort(); /* the test's own allocation, not input */
    }
    if (n) memcpy(b->b + b->n, p, n);
    b->n += n;
}

static void put_le(buf *b, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) {
        uint8_t c = (uint8_t)(v >> (8 * i));
        put(b, &c, 1);
    }
}
static void put_u32(buf *b, uint32_t v) { put_le(b, v, 4); }
static void put_u64(buf *b, uint64_t v) { put_le(b, v, 8); }
static void put_str(buf *b, const char *s) {
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}
static void put_key(buf *b, const char *k, uint32_t type) {
    put_str(b, k);
    put_u32(b, type);
}
static void put_f32(buf *b, float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    put_u32(b, u);
}

typedef struct {
    const char *name;
    uint32_t n_dims;
    int64_t ne[4];
    uint32_t type;
    uint64_t offset;
} tspec;

typedef struct {
    char magic[5];
    uint32_t version;
    int64_t n_tensors_hdr, n_kv_hdr; /* -1: the true count */
    int align_kind;                  /* 0 absent, 1 u32, 2 u64 (wrong type) */
    uint32_t align;
    buf extra; /* raw kv entries appended after the standard ones */
    int extra_n;
    int nt;
    tspec t[4];
    size_t data_size;
} spec;

#define BASE_KVS 9

static void put_base_kvs(buf *b) {
    put_key(b, "general.architecture", GGUF_STR);
    put_str(b, "llama");
    put_key(b, "llama.block_count", GGUF_U32);
    put_u32(b, 2);
    put_key(b, "llama.rope.freq_base", GGUF_F32);
    put_f32(b, 10000.0f);
    put_key(b, "tokenizer.ggml.add_bos_token", GGUF_BOOL);
    put_le(b, 1, 1);
    put_key(b, "tokenizer.ggml.tokens", GGUF_ARR);
    put_u32(b, GGUF_STR);
    put_u64(b, 3);
    put_str(b, "<s>");
    put_str(b, "");
    put_str(b, "w\xc3\xb6rld");
    put_key(b, "tokenizer.ggml.token_type", GGUF_ARR);
    put_u32(b, GGUF_I32);
    put_u64(b, 3);
    put_u32(b, (uint32_t)-5);
    put_u32(b, 7);
    put_u32(b, 1u << 30);
    put_key(b, "test.nested", GGUF_ARR); /* [[1, 2], []] of u8 */
    put_u32(b, GGUF_ARR);
    put_u64(b, 2);
    put_u32(b, GGUF_U8);
    put_u64(b, 2);
    put_le(b, 0x0201, 2);
    put_u32(b, GGUF_U8);
    put_u64(b, 0);
    put_key(b, "test.neg", GGUF_I64);
    put_u64(b, (uint64_t)-1);
    put_key(b, "test.f64", GGUF_F64);
    double d = 0.5;
    uint64_t du;
    memcpy(&du, &d, 8);
    put_u64(b, du);
}

static spec base_spec(void) {
    spec s;
    memset(&s, 0, sizeof s);
    memcpy(s.magic, "GGUF", 5);
    s.version = 3;
    s.n_tensors_hdr = s.n_kv_hdr = -1;
    s.align_kind = 1;
    s.align = 32;
    s.nt = 2;
    s.t[0] = (tspec){"tok.weight", 2, {8, 2, 1, 1}, QT_F32, 0};        /* 64 bytes */
    s.t[1] = (tspec){"blk.0.q.weight", 2, {64, 1, 1, 1}, QT_Q8_0, 64}; /* 2 blocks: 68 bytes */
    s.data_size = 132; /* the file ends with the last tensor: every prefix is short */
    return s;
}

static buf build(const spec *s) {
    buf b = {0};
    put(&b, s->magic, 4);
    put_u32(&b, s->version);
    put_u64(&b, s->n_tensors_hdr >= 0 ? (uint64_t)s->n_tensors_hdr : (uint64_t)s->nt);
    int n_kv = BASE_KVS + (s->align_kind != 0) + s->extra_n;
    put_u64(&b, s->n_kv_hdr >= 0 ? (uint64_t)s->n_kv_hdr : (uint64_t)n_kv);
    put_base_kvs(&b);
    if (s->align_kind == 1) {
        put_key(&b, "general.alignment", GGUF_U32);
        put_u32(&b, s->align);
    } else if (s->align_kind == 2) {
        put_key(&b, "general.alignment", GGUF_U64);
        put_u64(&b, s->align);
    }
    put(&b, s->extra.b, s->extra.n);
    for (int i = 0; i < s->nt; i++) {
        const tspec *t = &s->t[i];
        put_str(&b, t->name);
        put_u32(&b, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims && d < 8; d++)
            put_u64(&b, (uint64_t)t->ne[d & 3]);
        put_u32(&b, t->type);
        put_u64(&b, t->offset);
    }
    uint32_t a = s->align_kind == 1 && s->align && !(s->align & (s->align - 1)) ? s->align : 32;
    while (b.n % a)
        put_le(&b, 0, 1);
    for (size_t i = 0; i < s->data_size; i++)
        put_le(&b, (uint8_t)(i * 7 + 1), 1);
    return b;
}

/* Parses a private copy of exactly n bytes, so ASan sees any read past the end. */
static int open_copy(gguf_file *f, const uint8_t *p, size_t n) {
    uint8_t *copy = malloc(n ? n : 1);
    if (n) memcpy(copy, p, n);
    int rc = gguf_open_mem(f, copy, n);
    if (rc == 0) { /* touch every tensor byte range the reader handed out */
        for (uint64_t i = 0; i < f->n_tensors; i++) {
            const gguf_tensor *t = &f->tensors[i];
            if (t->size) {
                volatile uint8_t first = ((const uint8_t *)t->data)[0];
                volatile uint8_t last = ((const uint8_t *)t->data)[t->size - 1];
                (void)first, (void)last;
            }
        }
    }
    gguf_close(f);
    free(copy);
    return rc;
}

static void expect_fail(const char *what, spec *s, const char *needle) {
    buf b = build(s);
    gguf_file f;
    uint8_t *copy = malloc(b.n);
    memcpy(copy, b.b, b.n);
    int rc = gguf_open_mem(&f, copy, b.n);
    CHECK(rc < 0, "%s: expected failure, got %d", what, rc);
    CHECK(f.err[0] != 0, "%s: no error message", what);
    if (needle)
        CHECK(strstr(f.err, needle) != NULL, "%s: message '%s' lacks '%s'", what, f.err, needle);
    if (getenv("GGUF_TEST_VERBOSE")) printf("  %-28s -> %d %s\n", what, rc, f.err);
    CHECK(f.kv == NULL && f.tensors == NULL, "%s: freed on failure", what);
    gguf_close(&f);
    free(copy);
    free(b.b);
    free(s->extra.b);
    s->extra = (buf){0};
}

static void expect_ok(const char *what, spec *s) {
    buf b = build(s);
    gguf_file f;
    int rc = open_copy(&f, b.b, b.n);
    CHECK(rc == 0, "%s: expected success, got %d", what, rc);
    free(b.b);
    free(s->extra.b);
    s->extra = (buf){0};
}

/* ---------------------------------------------------------------- the small valid file */

static void test_base(void) {
    spec s = base_spec();
    buf b = build(&s);
    gguf_file f;
    int rc = gguf_open_mem(&f, b.b, b.n);
    CHECK(rc == 0, "base file: %d %s", rc, f.err);
    if (rc == 0) {
        CHECK(f.n_kv == BASE_KVS + 1 && f.n_tensors == 2 && f.alignment == 32, "base counts");
        uint32_t u;
        int32_t i32;
        float x;
        int bo;
        gguf_str str[3];
        CHECK(gguf_get_u32(&f, "llama.block_count", &u) == 0 && u == 2, "u32");
        CHECK(gguf_get_u32(&f, "test.neg", &u) == -ERANGE, "negative i64 as u32");
        CHECK(gguf_get_f32(&f, "test.f64", &x) == 0 && x == 0.5f, "f64 as f32");
        CHECK(gguf_get_bool(&f, "tokenizer.ggml.add_bos_token", &bo) == 0 && bo == 1, "bool");
        CHECK(gguf_get_bool(&f, "llama.block_count", &bo) == -EINVAL, "u32 as bool");
        const gguf_kv *kv = gguf_find(&f, "tokenizer.ggml.tokens");
        CHECK(kv && gguf_arr_strs(&f, kv, str, 3) == 0 && gguf_str_eq(str[0], "<s>") &&
                  str[1].len == 0 && gguf_str_eq(str[2], "w\xc3\xb6rld"),
              "string array");
        kv = gguf_find(&f, "tokenizer.ggml.token_type");
        CHECK(gguf_arr_i32(kv, 0, &i32) == 0 && i32 == -5, "i32[0] %d", i32);
        CHECK(gguf_arr_i32(kv, 2, &i32) == 0 && i32 == 1 << 30, "i32[2]");
        CHECK(gguf_arr_i32(kv, 3, &i32) == -ERANGE, "i32[3]");
        CHECK(gguf_arr_f32(kv, 0, &x) == -EINVAL, "i32 array as f32");
        kv = gguf_find(&f, "test.nested");
        CHECK(kv && kv->arr_type == GGUF_ARR && kv->arr_n == 2 && kv->val_size == 12 + 2 + 12,
              "nested array span");
        CHECK(gguf_arr_i32(kv, 0, &i32) == -EINVAL, "nested as i32");
        const gguf_tensor *t = gguf_tensor_find(&f, "blk.0.q.weight");
        CHECK(t && t->size == 68 && t->offset == 64 && (const uint8_t *)t->data + 68 == b.b + b.n,
              "last tensor ends the file");
        CHECK(f.data_offset % 32 == 0, "data offset aligned");
    }
    gguf_close(&f);

    /* Every proper prefix is malformed. */
    int crashed_ok = 0;
    for (size_t n = 0; n < b.n; n++) {
        gguf_file g;
        uint8_t *copy = malloc(n ? n : 1);
        if (n) memcpy(copy, b.b, n);
        rc = gguf_open_mem(&g, copy, n);
        if (rc < 0 && g.err[0])
            crashed_ok++;
        else
            CHECK(0, "prefix of %zu bytes: rc %d err '%s'", n, rc, g.err);
        gguf_close(&g);
        free(copy);
    }
    CHECK(crashed_ok == (int)b.n, "all %zu prefixes rejected (%d)", b.n, crashed_ok);

    /* Single-byte corruption anywhere: any result is fine, a crash is not. */
    for (size_t i = 0; i < b.n; i++) {
        static const uint8_t xors[] = {0x01, 0x80, 0xff, 0x40};
        for (size_t k = 0; k < sizeof xors; k++) {
            b.b[i] ^= xors[k];
            open_copy(&f, b.b, b.n);
            b.b[i] ^= xors[k];
        }
    }
    free(b.b);
}

/* ---------------------------------------------------------------- malformed variants */

static void extra_str_kv(spec *s, const char *key, uint64_t len) {
    put_key(&s->extra, key, GGUF_STR);
    put_u64(&s->extra, len);
    put(&s->extra, "abcd", 4);
    s->extra_n++;
}

static void extra_arr_kv(spec *s, uint32_t et, uint64_t n) {
    put_key(&s->extra, "test.arr", GGUF_ARR);
    put_u32(&s->extra, et);
    put_u64(&s->extra, n);
    put(&s->extra, "abcdefgh", 8);
    s->extra_n++;
}

/* depth levels of array, the innermost an empty u8 array. */
static void extra_nested(spec *s, int depth) {
    put_key(&s->extra, "test.deep", GGUF_ARR);
    for (int d = 1; d < depth; d++) {
        put_u32(&s->extra, GGUF_ARR);
        put_u64(&s->extra, 1);
    }
    put_u32(&s->extra, GGUF_U8);
    put_u64(&s->extra, 0);
    s->extra_n++;
}

static void test_header_errors(void) {
    spec s = base_spec();
    memcpy(s.magic, "GGUX", 4);
    expect_fail("bad magic", &s, "not a GGUF file");
    s = base_spec();
    s.version = 1;
    expect_fail("version 1", &s, "version 1");
    s = base_spec();
    s.version = 4;
    expect_fail("version 4", &s, "version 4");
    s = base_spec();
    s.version = 0x03000000u;
    expect_fail("big-endian", &s, "big-endian");
    s = base_spec();
    s.n_kv_hdr = INT64_C(1) << 62;
    expect_fail("huge n_kv", &s, "metadata entries");
    s = base_spec();
    s.n_kv_hdr = -1;
    s.n_tensors_hdr = INT64_C(1) << 62;
    expect_fail("huge n_tensors", &s, "tensors");
    s = base_spec();
    s.n_kv_hdr = BASE_KVS + 5; /* more entries claimed than present */
    expect_fail("n_kv too big", &s, NULL);
    s = base_spec();
    s.n_tensors_hdr = 3;
    expect_fail("n_tensors too big", &s, NULL);
    gguf_file f;
    CHECK(gguf_open_mem(&f, NULL, 0) < 0 && f.err[0], "empty buffer");
    gguf_close(&f);
}

static void test_kv_errors(void) {
    spec s = base_spec();
    extra_str_kv(&s, "test.s", UINT64_C(1) << 63);
    expect_fail("huge string length", &s, "length");
    s = base_spec();
    extra_str_kv(&s, "test.s", UINT64_MAX);
    expect_fail("string length 2^64-1", &s, "length");
    s = base_spec();
    s.nt = 0, s.data_size = 0; /* the file ends after <= 31 pad bytes */
    extra_str_kv(&s, "test.s", 4 + 32);
    expect_fail("string past end", &s, NULL);
    s = base_spec();
    extra_arr_kv(&s, GGUF_U8, UINT64_C(1) << 62);
    expect_fail("huge u8 array", &s, "cannot fit");
    s = base_spec();
    extra_arr_kv(&s, GGUF_U64, UINT64_C(1) << 61); /* count * 8 wraps 64 bits */
    expect_fail("wrapping u64 array", &s, "cannot fit");
    s = base_spec();
    extra_arr_kv(&s, GGUF_STR, UINT64_C(1) << 61);
    expect_fail("huge string array", &s, "cannot fit");
    s = base_spec();
    extra_arr_kv(&s, GGUF_ARR, UINT64_MAX);
    expect_fail("huge array of arrays", &s, "cannot fit");
    s = base_spec();
    extra_arr_kv(&s, 13, 1);
    expect_fail("unknown array type", &s, "unknown array element type 13");
    s = base_spec();
    extra_nested(&s, 5);
    expect_fail("arrays nested 5 deep", &s, "nested");
    s = base_spec();
    extra_nested(&s, 4);
    expect_ok("arrays nested 4 deep", &s);
    s = base_spec();
    put_key(&s.extra, "test.bad", 13);
    put_u32(&s.extra, 0);
    s.extra_n = 1;
    expect_fail("unknown value type", &s, "unknown value type 13");
    s = base_spec();
    put_key(&s.extra, "test.bad", UINT32_MAX);
    put_u32(&s.extra, 0);
    s.extra_n = 1;
    expect_fail("value type 2^32-1", &s, "unknown value type");
    s = base_spec();
    put_key(&s.extra, "llama.block_count", GGUF_U32);
    put_u32(&s.extra, 3);
    s.extra_n = 1;
    expect_fail("duplicate key", &s, "duplicate metadata key 'llama.block_count'");
}

static void test_alignment(void) {
    spec s = base_spec();
    s.align = 0;
    expect_fail("alignment 0", &s, "power of two");
    s = base_spec();
    s.align = 3;
    expect_fail("alignment 3", &s, "power of two");
    s = base_spec();
    s.align_kind = 2;
    expect_fail("alignment as u64", &s, "general.alignment");
    s = base_spec();
    s.align_kind = 0; /* default 32 */
    expect_ok("no alignment key", &s);
    s = base_spec();
    s.align = 64;
    s.t[1].offset = 64;
    expect_ok("alignment 64", &s);
    s = base_spec();
    s.align = 128;
    expect_fail("offset 64 with alignment 128", &s, "not a multiple of the alignment 128");
    s = base_spec();
    s.version = 2;
    expect_ok("version 2", &s);
    s = base_spec();
    s.nt = 0;
    s.data_size = 0;
    expect_ok("no tensors", &s);
}

static void test_tensor_errors(void) {
    spec s = base_spec();
    s.t[1].type = 99;
    expect_fail("unknown tensor type", &s, "tensor 'blk.0.q.weight' has unknown type 99");
    s = base_spec();
    s.t[1].type = 4; /* Q4_2, long gone from GGML */
    expect_fail("removed tensor type 4", &s, "unknown type 4");
    s = base_spec();
    s.t[1].type = 16; /* a GGML type kiln does not run: refused by its name */
    expect_fail("IQ2_XXS tensor", &s, "tensor 'blk.0.q.weight' has type IQ2_XXS (16), which kiln does not support");
    s = base_spec();
    s.t[0].n_dims = 0;
    expect_fail("n_dims 0", &s, "n_dims is 0");
    s = base_spec();
    s.t[0].n_dims = 5;
    expect_fail("n_dims 5", &s, "n_dims is 5");
    s = base_spec();
    s.t[0].ne[1] = -1;
    expect_fail("negative ne", &s, "negative");
    s = base_spec();
    s.t[0].n_dims = 4;
    s.t[0].ne[1] = s.t[0].ne[2] = s.t[0].ne[3] = INT64_C(1) << 21; /* 8 * 2^63 elements */
    expect_fail("overflowing ne product", &s, "overflows");
    s = base_spec();
    s.t[0].ne[0] = INT64_C(1) << 62; /* elements fit int64, bytes (x4) do not */
    s.t[0].ne[1] = 1;
    expect_fail("overflowing byte size", &s, "overflows");
    s = base_spec();
    s.t[0].ne[0] = 0;
    s.t[0].ne[1] = INT64_MAX; /* zero elements; must not multiply into trouble */
    expect_ok("zero-size tensor", &s);
    s = base_spec();
    s.t[1].ne[0] = 48;
    expect_fail("ne0 not a block multiple", &s, "not a multiple of its block size 32");
    s = base_spec();
    s.t[1].offset = UINT64_C(1) << 40;
    expect_fail("offset past end", &s, "runs past end of file");
    s = base_spec();
    s.t[1].offset = UINT64_MAX - 31;
    expect_fail("offset near 2^64", &s, "runs past end of file");
    s = base_spec();
    s.t[1].offset = 68;
    expect_fail("offset not aligned", &s, "not a multiple of the alignment 32");
    s = base_spec();
    s.t[1].ne[1] = 2;
    expect_fail("size past end", &s, "data [off 64, size 136] runs past end of file");
    s = base_spec();
    s.t[1].offset = 32;
    expect_fail("overlapping tensors", &s, "overlap");
    s = base_spec();
    s.t[0].offset = 64;
    s.t[1].offset = 0;
    s.t[1].ne[0] = 32; /* 34 bytes at 0, then 64 at 64: disjoint in reverse order */
    s.data_size = 128;
    expect_ok("tensors listed out of order", &s);
    s = base_spec();
    s.t[1].name = "tok.weight";
    expect_fail("duplicate tensor name", &s, "duplicate tensor name 'tok.weight'");
    s = base_spec();
    s.data_size = 0;
    expect_fail("no data section", &s, NULL);
}

static void test_files(void) {
    gguf_file f;
    int rc = gguf_open(&f, "/nonexistent/kiln/model.gguf");
    CHECK(rc == -ENOENT && strstr(f.err, "/nonexistent/kiln/model.gguf"), "ENOENT: %d %s", rc,
          f.err);
    gguf_close(&f);
    rc = gguf_open(&f, "/");
    CHECK(rc < 0 && f.err[0], "directory: %d %s", rc, f.err);
    gguf_close(&f);

    char path[] = "/tmp/test_gguf_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    if (fd < 0) return;
    rc = gguf_open(&f, path);
    CHECK(rc < 0 && strstr(f.err, "too small"), "empty file: %d %s", rc, f.err);
    gguf_close(&f);
    spec s = base_spec();
    buf b = build(&s);
    CHECK(write(fd, b.b, b.n) == (ssize_t)b.n, "write");
    rc = gguf_open(&f, path);
    CHECK(rc == 0 && f.mapped && f.n_tensors == 2, "mapped small file: %d %s", rc, f.err);
    gguf_close(&f);
    CHECK(ftruncate(fd, (off_t)b.n - 1) == 0, "truncate");
    rc = gguf_open(&f, path);
    CHECK(rc == -EINVAL && strstr(f.err, path) && strstr(f.err, "past end"), "truncated file: %s",
          f.err);
    gguf_close(&f);
    close(fd);
    unlink(path);
    free(b.b);

    gguf_file z;
    memset(&z, 0, sizeof z);
    int open0 = fcntl(0, F_GETFD) != -1;
    gguf_close(&z); /* a zeroed struct must not close fd 0 */
    CHECK((fcntl(0, F_GETFD) != -1) == open0, "fd 0 untouched by closing a zeroed struct");
}

int main(void) {
    const char *model = getenv("MODEL");
    test_model(model && *model ? model : "models/SmolLM2-135M-Instruct.Q4_1.gguf");
    test_base();
    test_header_errors();
    test_kv_errors();
    test_alignment();
    test_tensor_errors();
    test_files();
    return check_done("gguf");
}
