/* bundle: a slot image as one file, the bytes written as they are into a slot partition
 * (docs/IMAGE.md):
 *
 *   [0, BUN_HEAD)      the manifest (image/manifest.h), then NUL bytes up to BUN_HEAD
 *   then each part in the manifest's order, each starting on a BUN_ALIGN boundary
 *   (zero padding between), and nothing after the last one
 *
 * bun_verify reads a bundle from an fd at an offset (a file, a slot partition, a region
 * of a disk image): manifest, signature, every part's size and sha256, in that order, and
 * says which failed. Nothing is written. */
#ifndef KILN_IMAGE_BUNDLE_H
#define KILN_IMAGE_BUNDLE_H

#include <stdint.h>

#include "image/manifest.h"

#define BUN_HEAD 4096
#define BUN_ALIGN 4096

/* The offset of part i (from the bundle's start) and the bundle's total length. */
uint64_t bun_part_offset(const man_manifest *m, int i);
uint64_t bun_length(const man_manifest *m);

/* Reads and parses the manifest block at off. text (MAN_MAX + 1 bytes) gets its text. */
int bun_read_manifest(int fd, uint64_t off, man_manifest *m, char *text, char *err, size_t cap);
/* The manifest block, signature (pub) and every part's hash. limit: the bytes available
 * from off (a partition's size; 0: no limit). */
int bun_verify(int fd, uint64_t off, uint64_t limit, const uint8_t pub[MAN_PUB_LEN], man_manifest *m, char *err, size_t cap);
/* Hash of n bytes at off (pread in chunks). */
int bun_hash_range(int fd, uint64_t off, uint64_t n, uint8_t out[32], char *err, size_t cap);
/* A copy of part p elsewhere (the ESP's UKI): fd holds exactly p's bytes, no more, no less
 * (its size is fstat's for a regular file, else the end of p). 0, -EPERM (differs). */
int bun_check_copy(int fd, const man_part *p, char *err, size_t cap);
/* n bytes from src at soff to dst at doff, in chunks; dst synced, then read back and
 * compared with src (what is on the target is what was read). 0, -EIO (reads back
 * different), or -errno; err says which. kiln-flash's slot and UKI copies, kiln-init's
 * UKI onto the ESP for a network update. */
int bun_copy(int src, uint64_t soff, int dst, uint64_t doff, uint64_t n, char *err, size_t cap);
/* n bytes of buf at off (pwrite until done): 0 or -errno. */
int bun_write(int fd, const void *buf, size_t n, uint64_t off);

#endif
