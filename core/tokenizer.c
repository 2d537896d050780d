/* tokenizer.c: byte-level BPE and SentencePiece-style BPE over a GGUF vocabulary.
 *
 * Encoding a text: split it at special-token texts (when asked), pre-tokenize each plain
 * fragment into words with a hand-written matcher for the model's regex, then run BPE on
 * each word with a binary heap of candidate pairs (O(n log n) per word). Decoding maps an
 * id to bytes precomputed at init. */
#include "core/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/unicode_tables.h"

/* ------------------------------------------------------------------ small helpers */

typedef struct {
    const char *p;
    size_t n;
} sv;

static void seterr(char *err, size_t errlen, const char *msg, const char *detail) {
    if (err && errlen) snprintf(err, errlen, "tokenizer: %s%s%s", msg, detail ? ": " : "", detail ? detail : "");
}

static uint32_t hash_bytes(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 16777619u;
    return h;
}

static uint32_t hash_pair(uint64_t key) {
    return (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 32);
}

static uint32_t pow2_at_least(uint64_t n) {
    uint32_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

/* ------------------------------------------------------------------ unicode */

enum { C_L = 1, C_N = 2, C_S = 4 };
#define CP_BAD 0x110000u /* an invalid byte: a code point of its own, class 0 */

/* Decodes one code point at s[i] (i < e). Invalid or truncated sequences yield a single
 * byte with cp = CP_BAD + byte. Returns the byte length (1..4). */
static int utf8_next(const uint8_t *s, size_t i, size_t e, uint32_t *cp) {
    uint8_t b = s[i];
    if (b < 0x80) {
        *cp = b;
        return 1;
    }
    int n;
    uint32_t c;
    uint8_t lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) {
        n = 2;
        c = b & 0x1F;
    } else if (b >= 0xE0 && b <= 0xEF) {
        n = 3;
        c = b & 0x0F;
        if (b == 0xE0) lo = 0xA0;
        if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
        n = 4;
        c = b & 0x07;
        if (b == 0xF0) lo = 0x90;
        if (b == 0xF4) hi = 0x8F;
    } else {
        *cp = CP_BAD + b;
        return 1;
    }
    if (e - i < (size_t)n) goto bad;
    for (int k = 1; k < n; k++) {
        uint8_t x = s[i + k];
        if (x < lo || x > hi) goto bad;
        lo = 0x80, hi = 0xBF;
        c = (c << 6) | (x & 0x3F);
    }
    *cp = c;
    return n;
bad:
    *cp = CP_BAD + b;
    return 1;
}

static int cp_class(uint32_t cp) {
    if (cp < 0x80) {
        if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return C_L;
        if (cp >= '0' && cp <= '9') return C_N;
        if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D)) return C_S;
        return 0;
    }
    if (cp >= CP_BAD) return 0;
    for (size_t k = 0; k < sizeof uc_space / sizeof uc_space[0]; k++)
        if (cp >= uc_space[k].lo && cp <= uc_space[k].hi) return C_S;
    size_t lo = 0, hi = sizeof uc_ranges / sizeof uc_ranges[0];
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < uc_ranges[mid].lo) hi = mid;
        else if (cp > uc_ranges[mid].hi) lo = mid + 1;
        else return uc_ranges[mid].cat == UC_L ? C_L : C_N;
    }
    return 0;
}

static int is_mark(uint32_t cp) {
    size_t lo = 0, hi = sizeof uc_marks / sizeof uc_marks[0];
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < uc_marks[mid].lo) hi = mid;
        else if (cp > uc_marks[mid].hi) lo = mid + 1;
        else return 1;
    }
    return 0;
}

/* class of the code point at i, its length in *n */
static int cls_at(const uint8_t *s, size_t i, size_t e, int *n, uint32_t *cpo) {
    uint32_t cp;
    *n = utf8_next(s, i, e, &cp);
    if (cpo) *cpo = cp;
    return cp_class(cp);
}

/* GPT-2 byte-level mapping: printable bytes map to themselves, the rest to U+0100.. */
static int bl_printable(int b) {
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
}
static uint32_t bl_cp(int b) {
    if (bl_printable(b)) return (uint32_t)b;
    int k = 0;
    for (int x = 0; x < b; x++) k += !bl_printable(x);
    return 256u + (uint32_t)k;
}
/* inverse table: cp (0..323) -> byte, -1 when unmapped */
static void bl_inverse(int16_t inv[324]) {
    for (int i = 0; i < 324; i++) inv[i] = -1;
    for (int b = 0; b < 256; b++) inv[bl_cp(b)] = (int16_t)b;
}
static int utf8_put(uint32_t cp, char *o) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* ------------------------------------------------------------------ hash maps */

struct merge_ent {
    uint64_t key; /* left << 32 | right; UINT64_MAX empty */
    int32_t rank, id;
};

static int32_t vmap_get(const tok_t *t, const char *s, size_t n) {
    uint32_t h = hash_bytes(s, n) & t->vmap_mask;
    for (;;) {
        int32_t id = t->vmap[h];
        if (id < 0) return -1;
        if (t->text_len[id] == n && memcmp(t->text + t->text_off[id], s, n) == 0) return id;
        h = (h + 1) & t->vmap_mask;
    }
}

static const struct merge_ent *merge_get(const tok_t *t, int32_t a, int32_t b) {
    const struct merge_ent *m = t->mmap;
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    uint32_t h = hash_pair(key) & t->mmap_mask;
    for (;;) {
        if (m[h].key == key) return &m[h];
        if (m[h].key == UINT64_MAX) return NULL;
        h = (h + 1) & t->mmap_mask;
    }
}

/* ------------------------------------------------------------------ init */

struct vocab_in {
    int model;
    sv pre;
    int32_t n_vocab, n_merges;
    const sv *tokens, *merges;
    const int32_t *types;
    const float *scores;
    int32_t bos, eos, unk, eot, eom;
    int add_bos, add_space_prefix;
};

static int sv_eq(sv a, const char *c) {
    return a.n == strlen(c) && memcmp(a.p, c, a.n) == 0;
}

static void add_eog(tok_t *t, int32_t id) {
    if (id < 0 || id >= t->n_vocab) return;
    for (int i = 0; i < t->n_eog; i++)
        if (t->eog[i] == id) return;
    if (t->n_eog < (int32_t)(sizeof t->eog / sizeof t->eog[0])) t->eog[t->n_eog++] = id;
}

/* decoded piece of token i into o (capacity >= text length); returns its length */
static uint32_t make_piece(const tok_t *t, const int16_t inv[324], int32_t i, char *o) {
    const char *s = t->text + t->text_off[i];
    uint32_t n = t->text_len[i], k = 0;
    int ty = t->type[i];
    if (ty == TOK_CONTROL || ty == TOK_USER || ty == TOK_UNKNOWN || ty == TOK_UNUSED) {
        memcpy(o, s, n);
        return n;
    }
    if (t->model == TOK_SPM || t->pre == TOK_PRE_GEMMA4) { /* '▁' for ' ', <0xXX> bytes */
        unsigned v;
        if (ty == TOK_BYTE && n == 6 && sscanf(s, "<0x%2X>", &v) == 1) {
            o[0] = (char)v;
            return 1;
        }
        for (uint32_t j = 0; j < n;) {
            if (j + 3 <= n && memcmp(s + j, "\xE2\x96\x81", 3) == 0) {
                o[k++] = ' ';
                j += 3;
            } else {
                o[k++] = s[j++];
            }
        }
        return k;
    }
    for (uint32_t j = 0; j < n;) { /* byte-level: invert the mapping, or keep raw text */
        uint32_t cp;
        j += (uint32_t)utf8_next((const uint8_t *)s, j, n, &cp);
        if (cp >= 324 || inv[cp] < 0) {
            memcpy(o, s, n);
            return n;
        }
        o[k++] = (char)inv[cp];
    }
    return k;
}

static int build(tok_t *t, const struct vocab_in *in, char *err, size_t errlen) {
    memset(t, 0, sizeof *t);
    int32_t nv = in->n_vocab, nm = in->n_merges;
    if (nv <= 0 || nm < 0 || (in->model != TOK_BPE && in->model != TOK_SPM)) {
        seterr(err, errlen, "bad vocabulary", NULL);
        return TOK_EINVAL;
    }
    size_t text_bytes = 0;
    for (int32_t i = 0; i < nv; i++) {
        if (in->tokens[i].n > 0xFFFFFF) {
            seterr(err, errlen, "token text too long", NULL);
            return TOK_EINVAL;
        }
        text_bytes += in->tokens[i].n + 1;
    }
    uint32_t vcap = pow2_at_least((uint64_t)nv * 2), mcap = pow2_at_least((uint64_t)nm * 2 + 1);
    /* carve one block: [merge map][u32 x4][score][vmap][special][type][text][dec] */
    size_t off_mm = 0;
    size_t off_u32 = off_mm + (size_t)mcap * sizeof(struct merge_ent);
    size_t off_score = off_u32 + (size_t)nv * 4 * sizeof(uint32_t);
    size_t off_vmap = off_score + (size_t)nv * sizeof(float);
    size_t off_spec = off_vmap + (size_t)vcap * sizeof(int32_t);
    size_t off_type = off_spec + (size_t)nv * sizeof(int32_t);
    size_t off_text = off_type + (size_t)nv;
    size_t off_dec = off_text + text_bytes;
    size_t total = off_dec + text_bytes;
    char *mem = malloc(total);
    if (!mem) {
        seterr(err, errlen, "out of memory", NULL);
        return TOK_ENOMEM;
    }
    t->mem = mem;
    struct merge_ent *mm = (struct merge_ent *)(mem + off_mm);
    uint32_t *u32 = (uint32_t *)(mem + off_u32);
    uint32_t *text_off = u32, *text_len = u32 + nv, *dec_off = u32 + 2 * (size_t)nv, *dec_len = u32 + 3 * (size_t)nv;
    float *score = (float *)(mem + off_score);
    int32_t *vmap = (int32_t *)(mem + off_vmap), *special = (int32_t *)(mem + off_spec);
    uint8_t *type = (uint8_t *)(mem + off_type);
    char *text = mem + off_text, *dec = mem + off_dec;

    t->model = in->model;
    t->n_vocab = nv;
    t->text = text, t->dec = dec, t->type = type, t->score = score;
    t->text_off = text_off, t->text_len = text_len, t->dec_off = dec_off, t->dec_len = dec_len;
    t->vmap = vmap, t->vmap_mask = vcap - 1, t->mmap = mm, t->mmap_mask = mcap - 1;
    t->special = special;
    t->pre = TOK_PRE_GPT2;
    if (sv_eq(in->pre, "smollm") || sv_eq(in->pre, "starcoder") || sv_eq(in->pre, "refact"))
        t->pre = TOK_PRE_SMOLLM;
    else if (sv_eq(in->pre, "llama-bpe") || sv_eq(in->pre, "llama3"))
        t->pre = TOK_PRE_LLAMA3, t->ignore_merges = 1;
    else if (sv_eq(in->pre, "qwen2"))
        t->pre = TOK_PRE_QWEN2;
    else if (sv_eq(in->pre, "qwen35"))
        t->pre = TOK_PRE_QWEN35;
    else if (sv_eq(in->pre, "gemma4"))
        t->pre = TOK_PRE_GEMMA4;
    else if (t->model == TOK_BPE && !sv_eq(in->pre, "gpt2") && !sv_eq(in->pre, "gpt-2")) {
        /* another pre-tokenizer splits words differently: wrong ids, silently. Refused. */
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)(in->pre.n < 60 ? in->pre.n : 60), in->pre.p);
        free(mem);
        memset(t, 0, sizeof *t);
        seterr(err, errlen, "unsupported tokenizer.ggml.pre (kiln knows gpt2, smollm, starcoder, refact, "
               "llama-bpe, qwen2, qwen35, gemma4)", name);
        return TOK_EINVAL;
    }

    /* texts, types, scores, text -> id */
    size_t o = 0;
    for (uint32_t h = 0; h < vcap; h++) vmap[h] = -1;
    for (int32_t i = 0; i < nv; i++) {
        sv s = in->tokens[i];
        memcpy(text + o, s.p, s.n);
        text[o + s.n] = 0;
        text_off[i] = (uint32_t)o, text_len[i] = (uint32_t)s.n;
        o += s.n + 1;
        int ty = in->types ? in->types[i] : TOK_NORMAL;
        type[i] = (uint8_t)(ty >= 1 && ty <= 6 ? ty : TOK_NORMAL);
        score[i] = in->scores ? in->scores[i] : 0.0f;
        if ((int32_t)s.n > t->max_text) t->max_text = (int32_t)s.n;
        uint32_t h = hash_bytes(s.p, s.n) & t->vmap_mask;
        while (vmap[h] >= 0 && !(text_len[vmap[h]] == s.n && memcmp(text + text_off[vmap[h]], s.p, s.n) == 0))
            h = (h + 1) & t->vmap_mask;
        vmap[h] = i; /* a duplicate text: the last id wins */
    }
    /* decoded pieces */
    int16_t inv[324];
    bl_inverse(inv);
    o = 0;
    for (int32_t i = 0; i < nv; i++) {
        uint32_t n = make_piece(t, inv, i, dec + o);
        dec[o + n] = 0;
        dec_off[i] = (uint32_t)o, dec_len[i] = n;
        o += n + 1;
        if ((int32_t)n > t->max_piece) t->max_piece = (int32_t)n;
        if ((int32_t)text_len[i] > t->max_piece) t->max_piece = (int32_t)text_len[i];
    }
    /* byte symbols */
    for (int b = 0; b < 256; b++) {
        char buf[8];
        int n;
        if (t->model == TOK_BPE && t->pre != TOK_PRE_GEMMA4) {
            n = utf8_put(bl_cp(b), buf);
        } else {
            n = snprintf(buf, sizeof buf, "<0x%02X>", b);
        }
        t->byte_tok[b] = vmap_get(t, buf, (size_t)n);
    }
    /* merges: (left id, right id) -> rank, merged id */
    for (uint32_t h = 0; h < mcap; h++) mm[h].key = UINT64_MAX;
    char *cat = NULL;
    size_t catcap = 0;
    for (int32_t r = 0; r < nm; r++) {
        sv m = in->merges[r];
        size_t sp = 1;
        while (sp < m.n && m.p[sp] != ' ') sp++;
        if (m.n < 3 || sp >= m.n - 1) { /* not "left right": a malformed vocabulary */
            tok_free(t);
            free(cat);
            seterr(err, errlen, "a merge that is not two parts around a space", NULL);
            return TOK_EINVAL;
        }
        int32_t a = vmap_get(t, m.p, sp), b = vmap_get(t, m.p + sp + 1, m.n - sp - 1);
        if (a < 0 || b < 0) continue;
        if (m.n > catcap) {
            free(cat);
            catcap = m.n * 2;
            cat = malloc(catcap);
            if (!cat) {
                tok_free(t);
                seterr(err, errlen, "out of memory", NULL);
                return TOK_ENOMEM;
            }
        }
        memcpy(cat, m.p, sp);
        memcpy(cat + sp, m.p + sp + 1, m.n - sp - 1);
        int32_t c = vmap_get(t, cat, m.n - 1);
        if (c < 0) continue;
        uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
        uint32_t h = hash_pair(key) & t->mmap_mask;
        while (mm[h].key != UINT64_MAX && mm[h].key != key) h = (h + 1) & t->mmap_mask;
        if (mm[h].key == key) continue; /* a repeated pair keeps its first rank */
        mm[h].key = key, mm[h].rank = r, mm[h].id = c;
        t->n_merges++;
    }
    free(cat);
    if (t->model == TOK_BPE && t->n_merges == 0 && nm > 0) {
        tok_free(t);
        seterr(err, errlen, "no usable merges", NULL);
        return TOK_EINVAL;
    }
    /* specials: control and user-defined tokens, longest first (insertion sort: few) */
    for (int32_t i = 0; i < nv; i++) {
        if ((type[i] != TOK_CONTROL && type[i] != TOK_USER) || text_len[i] == 0) continue;
        int32_t k = t->n_special++;
        while (k > 0 && text_len[special[k - 1]] < text_len[i]) special[k] = special[k - 1], k--;
        special[k] = i;
        t->special_first[(uint8_t)text[text_off[i]]] = 1;
    }
    /* SPM: can a piece hold '▁' after another character? then words are not split */
    for (int32_t i = 0; t->model == TOK_SPM && i < nv && !t->spm_whole; i++) {
        const char *p = text + text_off[i];
        for (uint32_t j = 0; j + 3 <= text_len[i]; j++)
            if (memcmp(p + j, "\xE2\x96\x81", 3) == 0 && j > 0 &&
                (j < 3 || memcmp(p + j - 3, "\xE2\x96\x81", 3) != 0))
                t->spm_whole = 1;
    }
    /* ids and flags */
    t->bos = in->bos >= 0 && in->bos < nv ? in->bos : -1;
    t->eos = in->eos >= 0 && in->eos < nv ? in->eos : -1;
    t->unk = in->unk >= 0 && in->unk < nv ? in->unk : -1;
    t->add_bos = in->add_bos, t->add_space_prefix = in->add_space_prefix;
    add_eog(t, t->eos);
    add_eog(t, in->eot);
    add_eog(t, in->eom);
    static const char *const eog_texts[] = {"<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|endoftext|>",
                                            "<|end_of_text|>", "<end_of_turn>", "<|end|>"};
    for (size_t k = 0; k < sizeof eog_texts / sizeof eog_texts[0]; k++) {
        int32_t id = vmap_get(t, eog_texts[k], strlen(eog_texts[k]));
        if (id >= 0 && type[id] == TOK_CONTROL) add_eog(t, id);
    }
    return 0;
}

void tok_free(tok_t *t) {
    free(t->mem);
    memset(t, 0, sizeof *t);
}

static sv *cstr_svs(const char *const *a, int32_t n) {
    sv *v = malloc(sizeof *v * (size_t)(n > 0 ? n : 1));
    if (!v) return NULL;
    for (int32_t i = 0; i < n; i++) v[i].p = a[i], v[i].n = strlen(a[i]);
    return v;
}

int tok_init(tok_t *t, const tok_spec *s, char *err, size_t errlen) {
    memset(t, 0, sizeof *t);
    if (s->n_vocab <= 0 || !s->tokens || (s->n_merges > 0 && !s->merges)) {
        seterr(err, errlen, "bad spec", NULL);
        return TOK_EINVAL;
    }
    struct vocab_in in = {.model = s->model, .n_vocab = s->n_vocab, .n_merges = s->n_merges,
                          .types = s->types, .scores = s->scores, .bos = s->bos, .eos = s->eos,
                          .unk = s->unk, .eot = -1, .eom = -1, .add_bos = s->add_bos,
                          .add_space_prefix = s->add_space_prefix};
    in.pre.p = s->pre ? s->pre : "gpt2";
    in.pre.n = strlen(in.pre.p);
    sv *toks = cstr_svs(s->tokens, s->n_vocab), *merges = cstr_svs(s->merges, s->n_merges);
    int rc = TOK_ENOMEM;
    if (toks && merges) {
        in.tokens = toks, in.merges = merges;
        rc = build(t, &in, err, errlen);
    } else {
        seterr(err, errlen, "out of memory", NULL);
    }
    free(toks);
    free(merges);
    return rc;
}

static int32_t gguf_id(const gguf_file *f, const char *key) {
    uint32_t v;
    return gguf_get_u32(f, key, &v) == 0 && v <= INT32_MAX ? (int32_t)v : -1;
}

int tok_init_gguf(tok_t *t, const gguf_file *f, char *err, size_t errlen) {
    memset(t, 0, sizeof *t);
    gguf_str model, pre = {"gpt2", 4};
    if (gguf_get_str(f, "tokenizer.ggml.model", &model) != 0) {
        seterr(err, errlen, "missing tokenizer.ggml.model", NULL);
        return TOK_EINVAL;
    }
    struct vocab_in in = {0};
    int gemma4 = gguf_str_eq(model, "gemma4");
    if (gguf_str_eq(model, "gpt2") || gemma4) {
        in.model = TOK_BPE;
    } else if (gguf_str_eq(model, "llama")) {
        in.model = TOK_SPM;
    } else {
        char m[64];
        snprintf(m, sizeof m, "%.*s", (int)(model.len < 60 ? model.len : 60), model.ptr);
        seterr(err, errlen, "unsupported tokenizer.ggml.model", m);
        return TOK_EINVAL;
    }
    gguf_get_str(f, "tokenizer.ggml.pre", &pre);
    if (gemma4) pre = (gguf_str){"gemma4", 6}; /* the model name implies its pre-tokenizer */
    in.pre.p = pre.ptr, in.pre.n = pre.len;
    const gguf_kv *ktok = gguf_find(f, "tokenizer.ggml.tokens");
    const gguf_kv *kmer = gguf_find(f, "tokenizer.ggml.merges");
    const gguf_kv *ktype = gguf_find(f, "tokenizer.ggml.token_type");
    const gguf_kv *kscore = gguf_find(f, "tokenizer.ggml.scores");
    if (!ktok || ktok->type != GGUF_ARR || ktok->arr_type != GGUF_STR || ktok->arr_n == 0 ||
        ktok->arr_n > INT32_MAX / 4) {
        seterr(err, errlen, "missing or bad tokenizer.ggml.tokens", NULL);
        return TOK_EINVAL;
    }
    if (in.model == TOK_BPE && (!kmer || kmer->type != GGUF_ARR || kmer->arr_type != GGUF_STR ||
                                kmer->arr_n > INT32_MAX / 4)) {
        seterr(err, errlen, "missing or bad tokenizer.ggml.merges", NULL);
        return TOK_EINVAL;
    }
    int32_t nv = (int32_t)ktok->arr_n;
    int32_t nm = in.model == TOK_BPE ? (int32_t)kmer->arr_n : 0;
    gguf_str *gt = malloc(sizeof *gt * (size_t)nv), *gm = malloc(sizeof *gm * (size_t)(nm + 1));
    sv *vt = malloc(sizeof *vt * (size_t)nv), *vm = malloc(sizeof *vm * (size_t)(nm + 1));
    int32_t *types = malloc(sizeof *types * (size_t)nv);
    float *scores = malloc(sizeof *scores * (size_t)nv);
    int rc = TOK_ENOMEM;
    if (!gt || !gm || !vt || !vm || !types || !scores) {
        seterr(err, errlen, "out of memory", NULL);
        goto out;
    }
    rc = TOK_EINVAL;
    if (gguf_arr_strs(f, ktok, gt, (uint64_t)nv) != 0 || (nm && gguf_arr_strs(f, kmer, gm, (uint64_t)nm) != 0)) {
        seterr(err, errlen, "cannot read tokens/merges", f->err);
        goto out;
    }
    for (int32_t i = 0; i < nv; i++) {
        vt[i].p = gt[i].ptr, vt[i].n = (size_t)gt[i].len;
        types[i] = TOK_NORMAL;
        scores[i] = 0.0f;
        if (ktype && ktype->arr_n == (uint64_t)nv &&
            (gguf_arr_i32(ktype, (uint64_t)i, &types[i]) != 0 || types[i] < TOK_NORMAL || types[i] > TOK_BYTE)) {
            seterr(err, errlen, "bad tokenizer.ggml.token_type (a type outside 1..6)", NULL);
            goto out;
        }
        if (kscore && kscore->arr_n == (uint64_t)nv && gguf_arr_f32(kscore, (uint64_t)i, &scores[i]) != 0) {
            seterr(err, errlen, "bad tokenizer.ggml.scores", NULL);
            goto out;
        }
    }
    for (int32_t i = 0; i < nm; i++) vm[i].p = gm[i].ptr, vm[i].n = (size_t)gm[i].len;
    in.n_vocab = nv, in.n_merges = nm, in.tokens = vt, in.merges = vm, in.types = types, in.scores = scores;
    static const char *const ids[] = {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                                      "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.eot_token_id",
                                      "tokenizer.ggml.eom_token_id"};
    for (size_t k = 0; k < sizeof ids / sizeof ids[0]; k++) { /* present: a token of this vocabulary */
        uint32_t v;
        if (gguf_find(f, ids[k]) && (gguf_get_u32(f, ids[k], &v) != 0 || v >= (uint32_t)nv)) {
            seterr(err, errlen, "a special token id outside the vocabulary", ids[k]);
            goto out;
        }
    }
    in.bos = gguf_id(f, ids[0]);
    in.eos = gguf_id(f, ids[1]);
    in.unk = gguf_id(f, ids[2]);
    in.eot = gguf_id(f, ids[3]);
    in.eom = gguf_id(f, ids[4]);
    in.add_bos = in.model == TOK_SPM;
    in.add_space_prefix = in.model == TOK_SPM;
    gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &in.add_bos);
    gguf_get_bool(f, "tokenizer.ggml.add_space_prefix", &in.add_space_prefix);
    if (gemma4) in.add_bos = 1, in.add_space_prefix = 0; /* Gemma 4 always starts with <bos> */
    rc = build(t, &in, err, errlen);
out:
    free(gt), free(gm), free(vt), free(vm), free(types), free(scores);
    return rc;
}

/* ------------------------------------------------------------------ pre-tokenizers */

/* GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * Returns the end of the match that starts at i (< e). */
static size_t ws_run(const uint8_t *s, size_t i, size_t e, size_t *lastnl, int *have_nl) {
    size_t k = i, last = i;
    int n;
    uint32_t cp;
    *have_nl = 0;
    while (k < e && cls_at(s, k, e, &n, &cp) == C_S) {
        if (cp == '\r' || cp == '\n') *lastnl = k, *have_nl = 1;
        last = k, k += (size_t)n;
    }
    /* \s+(?!\S): the whole run at the end of the piece, else all but its last character
     * (a single one is taken by the \s+ that follows) */
    return k == e || last == i ? k : last;
}

static size_t run_of(const uint8_t *s, size_t k, size_t e, int c) {
    int n;
    while (k < e && cls_at(s, k, e, &n, NULL) == c) k += (size_t)n;
    return k;
}

static size_t pre_gpt2(const uint8_t *s, size_t i, size_t e) {
    int n, c;
    if (s[i] == '\'' && i + 1 < e) {
        uint8_t a = s[i + 1], b = i + 2 < e ? s[i + 2] : 0;
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    }
    if (s[i] == ' ' && i + 1 < e) { /* ' ?' before a letter, number or other run */
        c = cls_at(s, i + 1, e, &n, NULL);
        if (c != C_S) return run_of(s, i + 1, e, c);
    }
    c = cls_at(s, i, e, &n, NULL);
    if (c != C_S) return run_of(s, i, e, c);
    size_t lastnl;
    int have_nl;
    return ws_run(s, i, e, &lastnl, &have_nl);
}

/* the class at i, marks (\p{M}) counted as letters when asked: Qwen3.5's regex puts
 * [\p{L}\p{M}] wherever Qwen2's has \p{L}, which makes a mark a letter in every rule */
static int cls_lm(const uint8_t *s, size_t i, size_t e, int *n, uint32_t *cpo, int marks) {
    uint32_t cp;
    int c = cls_at(s, i, e, n, &cp);
    if (cpo) *cpo = cp;
    return marks && c == 0 && cp < CP_BAD && cp >= 0x300 && is_mark(cp) ? C_L : c;
}

/* Llama-3 / Qwen2: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,maxn}|
 *   ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * marks: Qwen3.5's, [\p{L}\p{M}] for \p{L} (and [^\s\p{L}\p{M}\p{N}] for [^\s\p{L}\p{N}]) */
static size_t pre_llama3(const uint8_t *s, size_t i, size_t e, int maxn, int marks) {
    int n, n2, c;
    uint32_t cp;
    if (s[i] == '\'' && i + 1 < e) {
        uint8_t a = s[i + 1] | 0x20, b = i + 2 < e ? s[i + 2] | 0x20 : 0;
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    }
    c = cls_lm(s, i, e, &n, &cp, marks);
    size_t k;
    if (c == C_L || (c != C_N && cp != '\r' && cp != '\n' && i + (size_t)n < e &&
                     cls_lm(s, i + (size_t)n, e, &n2, NULL, marks) == C_L)) {
        k = i + (size_t)n;
        while (k < e && cls_lm(s, k, e, &n2, NULL, marks) == C_L) k += (size_t)n2;
        return k;
    }
    if (c == C_N) {
        k = i + (size_t)n;
        for (int m = 1; m < maxn && k < e && cls_lm(s, k, e, &n2, NULL, marks) == C_N; m++) k += (size_t)n2;
        return k;
    }
    size_t j = i + (s[i] == ' ' && i + 1 < e);
    if (cls_lm(s, j, e, &n2, NULL, marks) == 0) {
        k = j + (size_t)n2;
        while (k < e && cls_lm(s, k, e, &n2, NULL, marks) == 0) k += (size_t)n2;
        while (k < e && (s[k] == '\r' || s[k] == '\n')) k++;
        return k;
    }
    /* whitespace at i: \s*[\r\n]+ up to the run's last newline, else \s+(?!\S) | \s+ */
    size_t lastnl = 0;
    int have_nl;
    k = ws_run(s, i, e, &lastnl, &have_nl);
    return have_nl ? lastnl + 1 : k;
}

/* ------------------------------------------------------------------ BPE merge loop */

struct sym {
    int32_t id, prev, next; /* BPE: id (-1 unknown, -2 merged away); SPM: id unused */
    int32_t b0, b1;         /* byte range in the word (SPM: in the escaped word) */
};
struct cand {
    float key; /* BPE: rank; SPM: -score. Smaller first, then smaller l */
    int32_t l, r, aux; /* BPE: right symbol's id when pushed; SPM: merged byte size */
};

static int cand_less(const struct cand *a, const struct cand *b) {
    return a->key < b->key || (a->key == b->key && a->l < b->l);
}
static void heap_push(struct cand *h, int *n, struct cand c) {
    int i = (*n)++;
    while (i > 0) {
        int p = (i - 1) / 2;
        if (!cand_less(&c, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = c;
}
static struct cand heap_pop(struct cand *h, int *n) {
    struct cand top = h[0], last = h[--(*n)];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && cand_less(&h[c + 1], &h[c])) c++;
        if (!cand_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0) h[i] = last;
    return top;
}

typedef struct {
    const tok_t *t;
    int32_t *out;
    int n, max, err;
    unsigned char *stk; /* stack scratch of STK bytes */
} enc;
#define STK ((size_t)TOK_WORD_MAX * 80)

static void emit(enc *E, int32_t id) {
    if (id < 0) return;
    if (E->n >= E->max) {
        E->err = TOK_ESPACE;
        return;
    }
    E->out[E->n++] = id;
}

/* scratch for n symbols (+ 3n candidates + extra bytes) from the stack, or malloc */
static void *scratch(enc *E, size_t n, size_t extra, struct sym **sy, struct cand **cd, char **ex) {
    size_t need = n * sizeof(struct sym) + 3 * n * sizeof(struct cand) + extra;
    void *p = need <= STK ? (void *)E->stk : malloc(need);
    if (!p) {
        E->err = TOK_ENOMEM;
        return NULL;
    }
    *sy = p;
    *cd = (struct cand *)((char *)p + n * sizeof(struct sym));
    if (ex) *ex = (char *)(*cd + 3 * n);
    return p;
}

static void bpe_push(const tok_t *t, struct sym *sy, struct cand *cd, int *nc, int32_t l) {
    if (l < 0) return;
    int32_t r = sy[l].next;
    if (r < 0 || sy[l].id < 0 || sy[r].id < 0) return;
    const struct merge_ent *m = merge_get(t, sy[l].id, sy[r].id);
    if (m) heap_push(cd, nc, (struct cand){(float)m->rank, l, r, sy[r].id});
}

/* merges the ns symbols of one word, lowest rank first (leftmost on a tie) */
static void bpe_merge(const tok_t *t, struct sym *sy, struct cand *cd, int32_t ns) {
    int nc = 0;
    for (int32_t i = 0; i + 1 < ns; i++) bpe_push(t, sy, cd, &nc, i);
    while (nc > 0) {
        struct cand c = heap_pop(cd, &nc);
        struct sym *L = &sy[c.l], *R = &sy[c.r];
        if (L->id < 0 || L->next != c.r || R->id != c.aux) continue;
        const struct merge_ent *m = merge_get(t, L->id, R->id);
        if (!m || (float)m->rank != c.key) continue;
        L->id = m->id;
        L->b1 = R->b1;
        L->next = R->next;
        if (R->next >= 0) sy[R->next].prev = c.l;
        R->id = -2; /* dead */
        bpe_push(t, sy, cd, &nc, L->prev);
        bpe_push(t, sy, cd, &nc, c.l);
    }
}

static void bpe_word(enc *E, const uint8_t *w, size_t n) {
    const tok_t *t = E->t;
    if (n == 1) { /* a byte the vocabulary lacks is dropped, as Hugging Face BPE does */
        emit(E, t->byte_tok[w[0]]);
        return;
    }
    if (t->ignore_merges && n <= TOK_WORD_MAX) {
        char buf[TOK_WORD_MAX * 2];
        size_t k = 0;
        for (size_t i = 0; i < n; i++) k += (size_t)utf8_put(bl_cp(w[i]), buf + k);
        int32_t id = vmap_get(t, buf, k);
        if (id >= 0) {
            emit(E, id);
            return;
        }
    }
    struct sym *sy;
    struct cand *cd;
    void *mem = scratch(E, n, 0, &sy, &cd, NULL);
    if (!mem) return;
    int32_t ns = 0; /* symbols: one per byte the vocabulary has (others are dropped) */
    for (size_t i = 0; i < n; i++) {
        if (t->byte_tok[w[i]] < 0) continue;
        sy[ns] = (struct sym){t->byte_tok[w[i]], ns - 1, -1, (int32_t)i, (int32_t)i + 1};
        if (ns > 0) sy[ns - 1].next = ns;
        ns++;
    }
    bpe_merge(t, sy, cd, ns);
    for (int32_t i = ns > 0 ? 0 : -1; i >= 0; i = sy[i].next) emit(E, sy[i].id);
    if (mem != (void *)E->stk) free(mem);
}

/* Gemma 4: BPE over a word's characters (not bytes), ' ' read as '▁'; a character the
 * vocabulary lacks stays a symbol of its own and falls back to its <0xXX> tokens. */
static void raw_bpe_word(enc *E, const uint8_t *w, size_t n) {
    const tok_t *t = E->t;
    struct sym *sy;
    struct cand *cd;
    void *mem = scratch(E, n, 0, &sy, &cd, NULL);
    if (!mem) return;
    int32_t space = vmap_get(t, "\xE2\x96\x81", 3), ns = 0;
    for (size_t i = 0; i < n; ns++) {
        uint32_t cp;
        size_t len = (size_t)utf8_next(w, i, n, &cp);
        int32_t id = w[i] == ' ' ? space : vmap_get(t, (const char *)w + i, len);
        sy[ns] = (struct sym){id, ns - 1, -1, (int32_t)i, (int32_t)(i + len)};
        if (ns > 0) sy[ns - 1].next = ns;
        i += len;
    }
    bpe_merge(t, sy, cd, ns);
    for (int32_t i = ns > 0 ? 0 : -1; i >= 0; i = sy[i].next) {
        if (sy[i].id >= 0) {
            emit(E, sy[i].id);
            continue;
        }
        for (int32_t b = sy[i].b0; b < sy[i].b1; b++) emit(E, t->byte_tok[w[b]]); /* absent: dropped */
    }
    if (mem != (void *)E->stk) free(mem);
}

/* Gemma 4's pre-tokenizer is [^\n]+|[\n]+; a run of newlines that is a token is taken whole */
static void gemma4_fragment(enc *E, const uint8_t *s, size_t n) {
    for (size_t p = 0; p < n && !E->err;) {
        int nl = s[p] == '\n';
        size_t q = p;
        while (q < n && (s[q] == '\n') == nl) q++;
        int32_t id = nl ? vmap_get(E->t, (const char *)s + p, q - p) : -1;
        if (id >= 0) emit(E, id);
        else raw_bpe_word(E, s + p, q - p);
        p = q;
    }
}

static void bpe_fragment(enc *E, const uint8_t *s, size_t n) {
    const tok_t *t = E->t;
    if (t->pre == TOK_PRE_GEMMA4) {
        gemma4_fragment(E, s, n);
        return;
    }
    size_t p = 0;
    while (p < n && !E->err) {
        size_t e = n;
        if (t->pre == TOK_PRE_SMOLLM) { /* every \p{N} is a piece of its own */
            for (size_t q = p; q < n;) {
                int k;
                if (cls_at(s, q, n, &k, NULL) == C_N) {
                    if (q == p) {
                        bpe_word(E, s + q, (size_t)k);
                        p = q + (size_t)k;
                        goto next;
                    }
                    e = q;
                    break;
                }
                q += (size_t)k;
            }
        }
        while (p < e && !E->err) {
            size_t m = t->pre == TOK_PRE_LLAMA3  ? pre_llama3(s, p, e, 3, 0)
                     : t->pre == TOK_PRE_QWEN2   ? pre_llama3(s, p, e, 1, 0)
                     : t->pre == TOK_PRE_QWEN35  ? pre_llama3(s, p, e, 1, 1)
                                                 : pre_gpt2(s, p, e);
            bpe_word(E, s + p, m - p);
            p = m;
        }
    next:;
    }
}

/* ------------------------------------------------------------------ SentencePiece */

static void spm_push(const tok_t *t, struct sym *sy, struct cand *cd, int *nc, const char *w, int32_t l) {
    if (l < 0) return;
    int32_t r = sy[l].next;
    if (r < 0) return;
    int32_t id = vmap_get(t, w + sy[l].b0, (size_t)(sy[r].b1 - sy[l].b0));
    if (id >= 0) heap_push(cd, nc, (struct cand){-t->score[id], l, r, sy[r].b1 - sy[l].b0});
}

/* one word: optional '▁' prefix, then n bytes with ' ' shown as '▁' */
static void spm_word(enc *E, const uint8_t *s, size_t n, int prefix) {
    const tok_t *t = E->t;
    size_t wl = n * 3 + 3;
    struct sym *sy;
    struct cand *cd;
    char *w;
    void *mem = scratch(E, n + 1, wl, &sy, &cd, &w);
    if (!mem) return;
    size_t k = 0;
    if (prefix) memcpy(w, "\xE2\x96\x81", 3), k = 3;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') memcpy(w + k, "\xE2\x96\x81", 3), k += 3;
        else w[k++] = (char)s[i];
    }
    int32_t ns = 0;
    for (size_t i = 0; i < k; ns++) {
        uint32_t cp;
        int len = utf8_next((const uint8_t *)w, i, k, &cp);
        sy[ns] = (struct sym){0, ns - 1, -1, (int32_t)i, (int32_t)(i + (size_t)len)};
        if (ns > 0) sy[ns - 1].next = ns;
        i += (size_t)len;
    }
    int nc = 0;
    for (int32_t i = 0; i + 1 < ns; i++) spm_push(t, sy, cd, &nc, w, i);
    while (nc > 0) {
        struct cand c = heap_pop(cd, &nc);
        struct sym *L = &sy[c.l], *R = &sy[c.r];
        if (L->b1 <= L->b0 || R->b1 <= R->b0 || L->next != c.r || R->b1 - L->b0 != c.aux) continue;
        L->b1 = R->b1;
        L->next = R->next;
        if (R->next >= 0) sy[R->next].prev = c.l;
        R->b1 = R->b0; /* dead */
        spm_push(t, sy, cd, &nc, w, L->prev);
        spm_push(t, sy, cd, &nc, w, c.l);
    }
    for (int32_t i = 0; ns > 0 && i >= 0; i = sy[i].next) {
        int32_t id = vmap_get(t, w + sy[i].b0, (size_t)(sy[i].b1 - sy[i].b0));
        if (id >= 0) {
            emit(E, id);
            continue;
        }
        for (int32_t b = sy[i].b0; b < sy[i].b1; b++) {
            int32_t bt = t->byte_tok[(uint8_t)w[b]];
            if (bt < 0) bt = vmap_get(t, w + b, 1);
            emit(E, bt >= 0 ? bt : t->unk);
        }
    }
    if (mem != (void *)E->stk) free(mem);
}

static void spm_fragment(enc *E, const uint8_t *s, size_t n, int prefix) {
    if (E->t->spm_whole) {
        spm_word(E, s, n, prefix);
        return;
    }
    /* words: spaces then non-spaces; a vocabulary without '▁' after other characters
     * cannot merge across these boundaries */
    size_t p = 0;
    while (p < n && !E->err) {
        size_t q = p;
        while (q < n && s[q] == ' ') q++;
        while (q < n && s[q] != ' ') q++;
        spm_word(E, s + p, q - p, prefix && p == 0);
        p = q;
    }
}

/* ------------------------------------------------------------------ encode */

static void fragment(enc *E, const uint8_t *s, size_t n, int prev_special) {
    if (E->t->model == TOK_SPM) {
        if (n > 0) spm_fragment(E, s, n, E->t->add_space_prefix && prev_special);
    } else if (n > 0) {
        bpe_fragment(E, s, n);
    }
}

static int encode(const tok_t *t, const char *text, size_t len, int parse_special, const size_t *plain,
                  int n_plain, int32_t *out, int max_out) {
    if (!t || !t->mem || (!text && len) || (!out && max_out > 0) || max_out < 0 || n_plain < 0 ||
        (n_plain && !plain))
        return TOK_EINVAL;
    unsigned char stk[STK];
    enc E = {t, out, 0, max_out, 0, stk};
    const uint8_t *s = (const uint8_t *)text;
    size_t start = 0;
    int prev_special = 1, sp = 0; /* plain[2 * sp] is the next plain range not wholly behind p */
    if (parse_special && t->n_special > 0) {
        for (size_t p = 0; p < len && !E.err;) {
            while (sp < n_plain && plain[2 * sp + 1] <= p) sp++;
            if (sp < n_plain && plain[2 * sp] <= p) { /* inside caller text: no special here */
                p = plain[2 * sp + 1];
                continue;
            }
            size_t room = (sp < n_plain ? plain[2 * sp] : len) - p; /* up to the next plain range */
            int32_t hit = -1;
            if (t->special_first[s[p]]) {
                for (int32_t k = 0; k < t->n_special; k++) {
                    int32_t id = t->special[k];
                    uint32_t sl = t->text_len[id];
                    if (sl <= room && sl <= len - p && memcmp(s + p, t->text + t->text_off[id], sl) == 0) {
                        hit = id;
                        break;
                    }
                }
            }
            if (hit < 0) {
                p++;
                continue;
            }
            fragment(&E, s + start, p - start, prev_special);
            emit(&E, hit);
            p += t->text_len[hit];
            start = p;
            prev_special = 1;
        }
    }
    if (!E.err) fragment(&E, s + start, len - start, prev_special);
    return E.err ? E.err : E.n;
}

int tok_encode(const tok_t *t, const char *text, size_t len, int parse_special, int32_t *out, int max_out) {
    return encode(t, text, len, parse_special, NULL, 0, out, max_out);
}

int tok_encode_plain(const tok_t *t, const char *text, size_t len, const size_t *plain, int n_plain,
                     int32_t *out, int max_out) {
    return encode(t, text, len, 1, plain, n_plain, out, max_out);
}

/* ------------------------------------------------------------------ decode */

static int hidden(const tok_t *t, int32_t id) {
    int ty = t->type[id];
    return ty == TOK_CONTROL || ty == TOK_UNKNOWN || ty == TOK_UNUSED;
}

int tok_decode(const tok_t *t, int32_t id, int render_special, char *buf, int cap) {
    if (!t || id < 0 || id >= t->n_vocab) return TOK_EINVAL;
    if (!render_special && hidden(t, id)) return 0;
    uint32_t n = t->dec_len[id];
    if (n > (uint32_t)(cap < 0 ? 0 : cap)) return TOK_ESPACE;
    memcpy(buf, t->dec + t->dec_off[id], n);
    return (int)n;
}

int tok_n_vocab(const tok_t *t) { return t->n_vocab; }
int32_t tok_bos(const tok_t *t) { return t->bos; }
int32_t tok_eos(const tok_t *t) { return t->eos; }
int32_t tok_find(const tok_t *t, const char *text, size_t len) { return vmap_get(t, text, len); }

int tok_is_eog(const tok_t *t, int32_t id) {
    for (int i = 0; i < t->n_eog; i++)
        if (t->eog[i] == id) return 1;
    return 0;
}

/* ------------------------------------------------------------------ incremental detokenizer */

void tok_stream_init(tok_stream *s, const tok_t *t, int render_special) {
    memset(s, 0, sizeof *s);
    s->t = t;
    s->render_special = render_special;
}

/* appends one byte through the UTF-8 state machine; o must have room for 6 bytes */
static int stream_byte(tok_stream *s, uint8_t b, char *o) {
    int k = 0;
    if (s->npend > 0) {
        uint8_t lo = 0x80, hi = 0xBF, lead = s->pend[0];
        if (s->npend == 1) {
            if (lead == 0xE0) lo = 0xA0;
            if (lead == 0xED) hi = 0x9F;
            if (lead == 0xF0) lo = 0x90;
            if (lead == 0xF4) hi = 0x8F;
        }
        if (b >= lo && b <= hi) {
            s->pend[s->npend++] = b;
            if (s->npend == s->need) {
                memcpy(o, s->pend, (size_t)s->npend);
                k = s->npend;
                s->npend = 0;
            }
            return k;
        }
        memcpy(o, "\xEF\xBF\xBD", 3); /* the held prefix can never complete */
        k = 3;
        s->npend = 0;
    }
    if (b < 0x80) {
        o[k++] = (char)b;
    } else if (b >= 0xC2 && b <= 0xF4) {
        s->pend[0] = b;
        s->npend = 1;
        s->need = b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
    } else {
        memcpy(o + k, "\xEF\xBF\xBD", 3);
        k += 3;
    }
    return k;
}

int tok_stream_push(tok_stream *s, int32_t id, char *out, int cap) {
    const tok_t *t = s->t;
    if (id < 0 || id >= t->n_vocab) return TOK_EINVAL;
    if (!s->render_special && hidden(t, id)) return 0;
    const uint8_t *p = (const uint8_t *)t->dec + t->dec_off[id];
    uint32_t n = t->dec_len[id];
    if ((size_t)cap < (size_t)n * 3 + 12) return TOK_ESPACE; /* worst case: all U+FFFD */
    if (!s->started && n > 0) {
        s->started = 1;
        if (t->model == TOK_SPM && t->add_space_prefix && p[0] == ' ') p++, n--;
    }
    int k = 0;
    for (uint32_t i = 0; i < n; i++) k += stream_byte(s, p[i], out + k);
    return k;
}

int tok_stream_flush(tok_stream *s, char *out, int cap) {
    if (s->npend == 0) return 0;
    if (cap < 3) return TOK_ESPACE;
    s->npend = 0;
    memcpy(out, "\xEF\xBF\xBD", 3);
    return 3;
}
