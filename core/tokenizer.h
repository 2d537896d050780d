/* tokenizer: byte-level BPE ("gpt2": SmolLM2, Llama-3, Qwen2/3, Qwen3.5), SentencePiece-style BPE
 * ("llama": Llama 2, Mistral, Phi-3, Gemma 3) and Gemma 4's BPE over '▁'-escaped text
 * ("gemma4": merges on characters, <0xXX> byte fallback) from a GGUF's tokenizer.ggml.*
 * metadata. Everything is allocated at init;
 * encode and decode write only into the caller's buffers (a single pre-token longer than
 * TOK_WORD_MAX bytes borrows a temporary scratch from malloc). Functions return counts
 * or a negative TOK_E* code. A tok_t is read-only after init: share it across threads. */
#ifndef KILN_TOKENIZER_H
#define KILN_TOKENIZER_H
#include <stddef.h>
#include <stdint.h>
#include "core/gguf.h"

enum { TOK_BPE = 1, TOK_SPM = 2 };                                      /* tok_t.model */
enum { TOK_PRE_GPT2, TOK_PRE_SMOLLM, TOK_PRE_LLAMA3, TOK_PRE_QWEN2, TOK_PRE_GEMMA4, TOK_PRE_QWEN35 }; /* .pre */
enum { TOK_NORMAL = 1, TOK_UNKNOWN = 2, TOK_CONTROL = 3, TOK_USER = 4, TOK_UNUSED = 5, TOK_BYTE = 6 };
enum { TOK_EINVAL = -1, TOK_ESPACE = -2, TOK_ENOMEM = -3 };
#define TOK_WORD_MAX 256

typedef struct {
    int model, pre;                  /* TOK_BPE/TOK_SPM, TOK_PRE_* */
    int32_t n_vocab, n_merges;
    int32_t bos, eos, unk;           /* ids, -1 when absent */
    int add_bos, add_space_prefix;   /* metadata flags (encode never adds BOS itself) */
    int ignore_merges;               /* llama-3: a word that is a whole token is emitted as is */
    int spm_whole;                   /* SPM vocab has '▁' after other chars: no word split */
    int32_t eog[8], n_eog;           /* end-of-generation ids */
    int32_t byte_tok[256];           /* BPE: the one-byte symbol; SPM: <0xXX>; -1 absent */
    int32_t max_text;                /* longest token text, bytes */
    int32_t max_piece;               /* longest decoded piece, bytes */
    char *mem;                       /* one allocation owning every array below */
    const char *text;                /* token texts, NUL-separated (vocab form: "Ġthe", "▁the") */
    const char *dec;                 /* decoded pieces, NUL-separated */
    const uint32_t *text_off, *text_len, *dec_off, *dec_len; /* [n_vocab] */
    const uint8_t *type;             /* [n_vocab] TOK_NORMAL.. */
    const float *score;              /* [n_vocab] SPM merge priority */
    const int32_t *vmap;             /* [vmap_mask+1] text -> id hash, -1 empty */
    const void *mmap;                /* [mmap_mask+1] (left,right) -> rank, merged id */
    uint32_t vmap_mask, mmap_mask;
    const int32_t *special;          /* [n_special] control/user ids, longest text first */
    int32_t n_special;
    uint8_t special_first[256];      /* 1 if some special text starts with this byte */
} tok_t;

/* Arrays for tok_init (tests, synthetic vocabs). Strings are NUL-terminated. */
typedef struct {
    int model;                       /* TOK_BPE or TOK_SPM */
    const char *pre;                 /* tokenizer.ggml.pre; NULL: "gpt2" */
    int32_t n_vocab, n_merges;
    const char *const *tokens;       /* [n_vocab] */
    const int32_t *types;            /* [n_vocab] or NULL: all TOK_NORMAL */
    const float *scores;             /* [n_vocab] or NULL: all 0 */
    const char *const *merges;       /* [n_merges] "left right", rank = index */
    int32_t bos, eos, unk;           /* -1: none */
    int add_bos, add_space_prefix;
} tok_spec;

int tok_init(tok_t *t, const tok_spec *s, char *err, size_t errlen);
int tok_init_gguf(tok_t *t, const gguf_file *f, char *err, size_t errlen);
void tok_free(tok_t *t);

/* Encode len bytes (any bytes; bad UTF-8 is tokenized byte by byte). parse_special: the
 * exact text of control/user tokens becomes their id. Returns the number of ids, or
 * TOK_ESPACE when max_out is too small (len + 2 always suffices). Never adds BOS. */
int tok_encode(const tok_t *t, const char *text, size_t len, int parse_special,
               int32_t *out, int max_out);
/* tok_encode with special tokens parsed except inside the n_plain byte ranges
 * [plain[2i], plain[2i + 1]) (ascending, disjoint): a special token's text must lie wholly
 * outside them (a chat prompt's contents: core/chat's spans). */
int tok_encode_plain(const tok_t *t, const char *text, size_t len, const size_t *plain, int n_plain,
                     int32_t *out, int max_out);
/* The bytes of one token (may be a partial UTF-8 sequence). Control, unknown and unused
 * tokens give 0 bytes unless render_special. Returns length, TOK_EINVAL or TOK_ESPACE. */
int tok_decode(const tok_t *t, int32_t id, int render_special, char *buf, int cap);
int tok_n_vocab(const tok_t *t);
int32_t tok_bos(const tok_t *t);
int32_t tok_eos(const tok_t *t);
int tok_is_eog(const tok_t *t, int32_t id);
int32_t tok_find(const tok_t *t, const char *text, size_t len); /* vocab form; -1 absent */

/* Incremental detokenizer: emits only whole UTF-8 characters; bytes that can never form
 * one become U+FFFD (one per maximal invalid subpart, like Rust's from_utf8_lossy). */
typedef struct {
    const tok_t *t;
    int render_special;
    int started;                     /* SPM: first piece's leading space is dropped */
    int npend, need;                 /* held-back bytes of one character, bytes it needs */
    uint8_t pend[4];
} tok_stream;
#define TOK_STREAM_CAP(t) (3 * ((t)->max_piece + 4)) /* enough for any push or flush */
void tok_stream_init(tok_stream *s, const tok_t *t, int render_special);
int tok_stream_push(tok_stream *s, int32_t id, char *out, int cap); /* bytes written or <0 */
int tok_stream_flush(tok_stream *s, char *out, int cap);            /* U+FFFD for leftovers */

#endif
