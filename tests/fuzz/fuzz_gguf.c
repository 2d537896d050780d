/* fuzz_gguf: libFuzzer target for the GGUF reader. libFuzzer hands us a buffer of
 * exactly `size` bytes, so ASan flags any read past it; after a successful open we
 * also touch what the reader returned (strings, array elements, tensor data ends) to
 * prove the pointers it hands out are in bounds. */
#include <stddef.h>
#include <stdint.h>

#include "core/gguf.h"

static volatile uint8_t sink;

static void touch(const void *p, uint64_t n) {
    if (n) sink ^= ((const uint8_t *)p)[0] ^ ((const uint8_t *)p)[n - 1];
}

static void poke_kv(const gguf_file *f, const gguf_kv *kv) {
    touch(kv->key.ptr, kv->key.len);
    if (kv->type != GGUF_ARR || kv->arr_n == 0) return;
    int32_t i;
    float x;
    gguf_arr_i32(kv, 0, &i);
    gguf_arr_i32(kv, kv->arr_n - 1, &i);
    gguf_arr_f32(kv, kv->arr_n - 1, &x);
    gguf_arr_i32(kv, kv->arr_n, &i); /* one past: must be refused */
    if (kv->arr_type == GGUF_STR) {
        gguf_str s[8];
        uint64_t n = kv->arr_n < 8 ? kv->arr_n : 8;
        if (gguf_arr_strs(f, kv, s, n) == 0)
            for (uint64_t k = 0; k < n; k++)
                touch(s[k].ptr, s[k].len);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    gguf_file f;
    if (gguf_open_mem(&f, data, size) == 0) {
        uint32_t u;
        float x;
        int b;
        gguf_str s;
        gguf_get_u32(&f, "general.alignment", &u);
        gguf_get_u32(&f, "llama.block_count", &u);
        gguf_get_f32(&f, "llama.rope.freq_base", &x);
        gguf_get_bool(&f, "tokenizer.ggml.add_bos_token", &b);
        if (gguf_get_str(&f, "general.architecture", &s) == 0) touch(s.ptr, s.len);
        for (uint64_t i = 0; i < f.n_kv; i++)
            poke_kv(&f, &f.kv[i]);
        for (uint64_t i = 0; i < f.n_tensors; i++) {
            const gguf_tensor *t = &f.tensors[i];
            touch(t->name.ptr, t->name.len);
            touch(t->data, t->size);
        }
        gguf_tensor_find(&f, "token_embd.weight");
    }
    gguf_close(&f);
    return 0;
}
