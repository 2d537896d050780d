/* manifest: the signed description of one kiln slot image (docs/IMAGE.md).
 *
 * A manifest is a short ASCII text, at most MAN_MAX bytes, lines ending in "\n", in this
 * exact order and nothing else:
 *
 *   kiln-manifest 1
 *   version 2                       decimal, 1..4294967295, no leading zeros
 *   build-time 0                    seconds since 1970 (SOURCE_DATE_EPOCH), no leading zeros
 *   part uki 10485760 <sha256 hex>  1..MAN_PARTS lines: name [a-z0-9-]{1,31} (unique),
 *                                   size in bytes, sha256 in lowercase hex
 *   sig <r||s hex>                  ECDSA P-256 over the SHA-256 of every byte above
 *
 * The parser is strict and bounded (it is outside input: a file, a disk, the network).
 * Signatures are deterministic (RFC 6979), so the same key and text give the same bytes.
 * Keys are one-line text files: "kiln-key p256 private <64 hex>" and
 * "kiln-key p256 public <130 hex>" (the uncompressed point 04||X||Y).
 *
 * Functions return 0 or a negative errno-style code and write a message to err. */
#ifndef KILN_IMAGE_MANIFEST_H
#define KILN_IMAGE_MANIFEST_H

#include <stddef.h>
#include <stdint.h>

#define MAN_MAX 4096      /* bytes of a whole manifest, signature included */
#define MAN_PARTS 8       /* parts per manifest */
#define MAN_NAME_MAX 32   /* a part name's bytes, NUL included */
#define MAN_PUB_LEN 65    /* an uncompressed P-256 point */
#define MAN_PRIV_LEN 32
#define MAN_SIG_LEN 64    /* r || s */
#define MAN_KEY_TEXT_MAX 192

typedef struct {
    char name[MAN_NAME_MAX];
    uint64_t size;          /* bytes */
    uint8_t sha256[32];
} man_part;

typedef struct {
    uint32_t version;
    uint64_t build_time;    /* seconds since 1970 */
    int nparts;
    man_part parts[MAN_PARTS];
    size_t signed_len;      /* bytes of the text the signature covers */
    uint8_t sig[MAN_SIG_LEN];
} man_manifest;

/* Parses text (len bytes, need not be NUL-terminated); does not check the signature. */
int man_parse(const char *text, size_t len, man_manifest *m, char *err, size_t cap);
/* The signed part of m as text (no "sig" line); returns its length or < 0. */
int man_format_body(const man_manifest *m, char *out, size_t cap, char *err, size_t errcap);
/* Signs m with priv: writes the whole manifest into out, returns its length or < 0. */
int man_sign(man_manifest *m, const uint8_t priv[MAN_PRIV_LEN], char *out, size_t cap, char *err, size_t errcap);
/* Checks the signature over text (as parsed into m) with pub. 0: good. */
int man_verify(const man_manifest *m, const char *text, const uint8_t pub[MAN_PUB_LEN], char *err, size_t cap);
/* The part named name, or NULL. */
const man_part *man_find(const man_manifest *m, const char *name);
int man_name_ok(const char *name);

/* A new key pair from the kernel's random source. */
int man_keygen(uint8_t priv[MAN_PRIV_LEN], uint8_t pub[MAN_PUB_LEN], char *err, size_t cap);
/* The public key of priv. */
int man_pub_of(const uint8_t priv[MAN_PRIV_LEN], uint8_t pub[MAN_PUB_LEN], char *err, size_t cap);
/* Key files' text: format, and parse (is_private picks the kind expected). */
int man_key_format(int is_private, const uint8_t *key, char *out, size_t cap);
int man_key_parse(int is_private, const char *text, size_t len, uint8_t *key, char *err, size_t cap);

/* Streaming SHA-256 (mbedTLS underneath). */
typedef struct { _Alignas(16) uint8_t ctx[256]; } man_sha;
void man_sha_init(man_sha *s);
void man_sha_update(man_sha *s, const void *p, size_t n);
void man_sha_final(man_sha *s, uint8_t out[32]);
void man_hex(const uint8_t *p, size_t n, char *out); /* out: 2n+1 bytes */

#endif
