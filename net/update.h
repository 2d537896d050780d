/* update: the bytes of a network update (the admin verb UPDATE, docs/PROTOCOL.md) going
 * into the inactive slot's partition (docs/IMAGE.md).
 *
 * kilnd only writes: kiln-init tells it which slot is inactive and where its partition is
 * (`kilnd serve --update-slot b:/dev/vda3`), removes that slot's boot entry before the
 * first byte, and after the last one verifies what the partition holds with the built-in
 * key and activates it (boot/disk.c). So the network-facing process never decides what
 * boots, and it never learns a device but the one slot it was given.
 *
 * The transfer is written as it arrives (pwrite, no buffering beyond one read) and hashed
 * on the way; upd_finish syncs the device and compares the hash with the one the client
 * announced. */
#ifndef KILN_UPDATE_H
#define KILN_UPDATE_H

#include <stddef.h>
#include <stdint.h>

#include "mbedtls/sha256.h"

typedef struct {
    char slot;             /* 'a' or 'b'; 0: no update target (not booted from an A/B disk) */
    char dev[64];          /* its partition ("/dev/vda3"), or a file standing in for it */
    uint64_t cap;          /* the partition's bytes (known once opened) */
    int fd;                /* -1 unless a transfer is open */
    uint64_t size, done;   /* announced and written bytes */
    uint8_t want[32];      /* the sha256 the client announced */
    mbedtls_sha256_context sha;
} upd;

/* "b:/dev/vda3" (the --update-slot argument); NULL or "" leaves it off. 0 or -EINVAL. */
int upd_init(upd *u, const char *spec);
int upd_enabled(const upd *u);
int upd_busy(const upd *u);
/* Opens the slot for a transfer of size bytes with that sha256. -ENODEV (no target),
 * -EBUSY (one is open), -EFBIG (larger than the slot), or -errno; err says why. */
int upd_open(upd *u, uint64_t size, const uint8_t sha256[32], char *err, size_t cap);
/* Writes the next n bytes (never past size). 0 or -errno. */
int upd_write(upd *u, const void *buf, size_t n, char *err, size_t cap);
/* After size bytes: synced, then the hash compared. 0, -EBADMSG (the hash differs), or
 * -errno. The transfer is closed either way. */
int upd_finish(upd *u, char *err, size_t cap);
/* A broken transfer: closed, what was written stays (the slot has no boot entry). */
void upd_abort(upd *u);

#endif
