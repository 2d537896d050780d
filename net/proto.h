/* proto: the kiln line protocol (docs/PROTOCOL.md is the specification).
 *
 * One message per line: a verb, then positional words and key=value pairs separated by
 * single or repeated spaces; a value is a bare word or a double-quoted string with C
 * escapes. Parsing is strict and bounded: a bad line gives a 400 with one line saying
 * what and where, never a crash, and never reads past len. Parsing works in place:
 * quoted strings are unescaped inside the caller's buffer (they only shrink) and every
 * word, key and value is NUL-terminated there, so the results point into the line.
 *
 * The same splitter reads server lines (TOK, END, ERR, OK ...) for clients and tests;
 * proto_gen and proto_hello give typed, range-checked views of the client verbs. */
#ifndef KILN_PROTO_H
#define KILN_PROTO_H

#include <stddef.h>
#include <stdint.h>

#define PROTO_VERB_MAX 16  /* longest verb */
#define PROTO_KEY_MAX 32   /* longest key */
#define PROTO_ID_MAX 64    /* longest request id */
#define PROTO_MAX_POS 4    /* positional words after the verb */
#define PROTO_MAX_MSGS 256 /* messages of a GEN conversation (system= user= assistant=) */
#define PROTO_MAX_KV (32 + PROTO_MAX_MSGS) /* key=value pairs: 32, and room for the messages */
#define PROTO_MAX_STOPS 4  /* stop strings per GEN */

typedef struct {
    char *s;    /* NUL-terminated, inside the line */
    size_t len; /* bytes before the NUL (a quoted string cannot hold NUL: \0 is refused) */
    int quoted; /* it was a "string" */
} proto_str;

typedef struct {
    proto_str key; /* [a-z][a-z0-9_]*, at most PROTO_KEY_MAX */
    proto_str val;
} proto_kv;

typedef struct {
    char verb[PROTO_VERB_MAX + 1]; /* upper-case A-Z letters as sent ("GEN") */
    int n_pos;
    proto_str pos[PROTO_MAX_POS];
    int n_kv;
    proto_kv kv[PROTO_MAX_KV];
} proto_line;

/* Split line[0..len) (no trailing '\n'; a trailing '\r' is allowed and ignored) in
 * place. Quoted strings must be valid UTF-8 after unescaping, and raw control bytes are
 * refused everywhere. Escapes: \" \\ \n \r \t \xHH (a byte, not 00) \uXXXX (a code
 * point, not 0 or a surrogate, written as UTF-8). Keys may repeat (proto_gen decides).
 * 0, or -EINVAL with err set ("col 14: unterminated string"). */
int proto_split(char *line, size_t len, proto_line *out, char *err, size_t errlen);

/* The value of key (first occurrence), or NULL. */
const proto_str *proto_get(const proto_line *l, const char *key);

/* HELLO kiln/1 token=SECRET */
typedef struct {
    int version;       /* 1 for "kiln/1" */
    const char *token; /* NULL when absent */
} proto_hello;
int proto_hello_parse(const proto_line *l, proto_hello *h, char *err, size_t errlen);

/* Bits of proto_gen.set: which optional keys the client gave (others take the
 * server's configured defaults). */
enum {
    PG_MAX_TOKENS = 1 << 0, PG_TEMPERATURE = 1 << 1, PG_TOP_P = 1 << 2, PG_TOP_K = 1 << 3,
    PG_MIN_P = 1 << 4, PG_REPEAT_PENALTY = 1 << 5, PG_REPEAT_LAST_N = 1 << 6,
    PG_PRESENCE = 1 << 7, PG_FREQUENCY = 1 << 8, PG_SEED = 1 << 9,
};

/* One message of a GEN conversation. */
typedef struct {
    const char *role;    /* "system", "user" or "assistant": the key it came as */
    const char *content; /* NUL-terminated UTF-8, inside the line */
    size_t len;
} proto_msg;

/* GEN id=ID prompt="..." [chat=0|1] [system="..."] [max_tokens=N] [temperature=F]
 *     [top_p=F] [top_k=N] [min_p=F] [repeat_penalty=F] [repeat_last_n=N]
 *     [presence_penalty=F] [frequency_penalty=F] [seed=N] [n=N] [stop="..."]...
 *     [logprobs=0|1] [ignore_eos=0|1]
 * Ranges: id 1..PROTO_ID_MAX of [A-Za-z0-9_.:-]; max_tokens 0..1000000; temperature
 * 0..100; top_p (0,1]; top_k 0..1000000; min_p 0..1; repeat_penalty (0,10];
 * repeat_last_n 0..1000000; presence/frequency -2..2; seed 0..2^64-1; n 1..8; stop up
 * to PROTO_MAX_STOPS times, each 1..64 bytes; prompt required (may be empty only with
 * chat=1 and a system message). Unknown keys and duplicates (other than stop) are
 * errors. Strings point into the line.
 * The conversation form: instead of prompt, chat=1 with the messages as repeatable
 * user="..." and assistant="..." keys in wire order, system="..." (once) before them;
 * the last one a user message; at most PROTO_MAX_MSGS in all. They land in msgs (system
 * as msgs[0], g->system NULL); prompt with user= or assistant= is an error. */
typedef struct {
    const char *id;
    const char *prompt;
    size_t prompt_len;
    const char *system; /* NULL when absent (and in the conversation form) */
    size_t system_len;
    proto_msg msgs[PROTO_MAX_MSGS]; /* the conversation form's messages, in wire order */
    int n_msgs;                     /* 0: the prompt form */
    int chat, n, logprobs, ignore_eos;
    int top_logprobs;     /* the OpenAI API's (0..20): no GEN key sets it */
    int max_tokens, top_k, repeat_last_n;
    float temperature, top_p, min_p, repeat_penalty, presence_penalty, frequency_penalty;
    uint64_t seed;
    const char *stops[PROTO_MAX_STOPS];
    int n_stops;
    unsigned set; /* PG_* */
} proto_gen;
int proto_gen_parse(const proto_line *l, proto_gen *g, char *err, size_t errlen);
/* The same request from another framing (the OpenAI API's JSON, net/api.h), so both
 * share GEN's keys, ranges and messages: proto_gen_init gives GEN's defaults (nothing
 * set, no id, no prompt); proto_gen_set applies one GEN key (not id, prompt or a message)
 * as if it came in a line, val as its bare text (quoted for stop). 0 or -EINVAL (an
 * unknown key, or a value GEN would refuse) with err. */
void proto_gen_init(proto_gen *g);
int proto_gen_set(proto_gen *g, const char *key, const proto_str *val, char *err, size_t errlen);

/* UPDATE size=N sha256=HEX [tries=T] (admin; docs/PROTOCOL.md): N 1..2^40 bytes of a signed
 * bundle follow once the server says OK; sha256 is 64 lower-case hex digits (the whole
 * bundle's); tries 1..9, default 3. No positional words, no other keys, no duplicates. */
typedef struct {
    uint64_t size;
    uint8_t sha256[32];
    int tries;
} proto_update;
int proto_update_parse(const proto_line *l, proto_update *u, char *err, size_t errlen);

/* A request id as the protocol allows it (1..PROTO_ID_MAX of [A-Za-z0-9_.:-]). */
int proto_id_ok(const char *s, size_t len);

/* Writes s[0..len) as a quoted string with escapes (\" \\ \n \r \t, other bytes below
 * 0x20 and 0x7f as \xHH; valid UTF-8 passes through; invalid bytes as \xHH), NUL-
 * terminated. The length written, or -ENOSPC; PROTO_QUOTED_MAX(len) bytes always
 * suffice. */
#define PROTO_QUOTED_MAX(len) (4 * (len) + 3)
int proto_quote(char *out, size_t cap, const char *s, size_t len);

#endif
