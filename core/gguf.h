/* gguf: a read-only GGUF v2/v3 reader over mmap.
 *
 * Every count, length and offset in the file is checked against the file size
 * before it is trusted; a malformed file yields a negative code and a message in
 * gguf_file.err, never a crash. Tensor data is read in place from the mapping. */
#ifndef KILN_GGUF_H
#define KILN_GGUF_H

#include <stddef.h>
#include <stdint.h>

enum gguf_vtype {
    GGUF_U8 = 0, GGUF_I8 = 1, GGUF_U16 = 2, GGUF_I16 = 3, GGUF_U32 = 4, GGUF_I32 = 5,
    GGUF_F32 = 6, GGUF_BOOL = 7, GGUF_STR = 8, GGUF_ARR = 9, GGUF_U64 = 10, GGUF_I64 = 11,
    GGUF_F64 = 12,
};

typedef struct {
    const char *ptr; /* not NUL-terminated: points into the mapping */
    uint64_t len;
} gguf_str;

typedef struct {
    gguf_str key;
    uint32_t type;      /* enum gguf_vtype */
    uint32_t arr_type;  /* element type when type == GGUF_ARR */
    uint64_t arr_n;     /* element count when type == GGUF_ARR */
    const uint8_t *val; /* raw little-endian value (or first array element) in the mapping */
    uint64_t val_size;  /* bytes spanned by the value */
} gguf_kv;

#define GGUF_MAX_DIMS 4

typedef struct {
    gguf_str name;
    uint32_t n_dims;
    int64_t ne[GGUF_MAX_DIMS]; /* ne[0] is the contiguous (row) length; unused dims are 1 */
    uint32_t type;             /* enum qtype (core/cpu/quant.h) */
    uint64_t offset;           /* relative to the data section */
    uint64_t size;             /* bytes: quant_row_size(type, ne[0]) * rows */
    const void *data;          /* in the mapping */
} gguf_tensor;

typedef struct {
    /* the mapping (or a caller's buffer for gguf_open_mem) */
    const uint8_t *base;
    size_t size;
    int fd;
    int mapped;
    uint32_t version;
    uint32_t alignment;
    uint64_t n_kv, n_tensors;
    gguf_kv *kv;          /* [n_kv] */
    gguf_tensor *tensors; /* [n_tensors] */
    size_t data_offset;   /* start of the aligned tensor data section */
    char err[256];        /* set when an open fails (lookups only return codes) */
} gguf_file;

/* Returns 0, or a negative errno-style code with f->err describing the problem. */
int gguf_open(gguf_file *f, const char *path);
int gguf_open_mem(gguf_file *f, const void *buf, size_t size); /* buf outlives f */
void gguf_close(gguf_file *f);

/* Lookups return NULL / negative when absent or of the wrong type: -ENOENT absent,
 * -EINVAL wrong type, -ERANGE value or index out of range. */
const gguf_kv *gguf_find(const gguf_file *f, const char *key);
const gguf_tensor *gguf_tensor_find(const gguf_file *f, const char *name);
int gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out); /* any integer type that fits */
int gguf_get_f32(const gguf_file *f, const char *key, float *out);    /* F32 or F64 */
int gguf_get_bool(const gguf_file *f, const char *key, int *out);
int gguf_get_str(const gguf_file *f, const char *key, gguf_str *out);
/* Array of strings: element i of an GGUF_ARR of GGUF_STR (walks the array: O(i) the
 * first time; gguf_arr_strs fills a caller array of n entries in one pass). */
int gguf_arr_strs(const gguf_file *f, const gguf_kv *kv, gguf_str *out, uint64_t n);
/* Typed array element access for numeric arrays (bounds-checked). */
int gguf_arr_i32(const gguf_kv *kv, uint64_t i, int32_t *out);
int gguf_arr_f32(const gguf_kv *kv, uint64_t i, float *out);
int gguf_str_eq(gguf_str s, const char *c);

#endif
