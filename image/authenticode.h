/* authenticode: is a PE image (a UKI, systemd-boot) signed for UEFI Secure Boot by a given
 * certificate? What the firmware checks before it starts an image, done here so that
 * kiln-init refuses a network update whose UKI the firmware would refuse (docs/IMAGE.md,
 * "Secure Boot"). The image's Authenticode hash (SHA-256, computed as EDK2 does: headers
 * without the checksum and the certificate table's entry, sections in file order, the
 * bytes after them up to the certificate table), then each WIN_CERTIFICATE's PKCS#7
 * SignedData: its SpcIndirectDataContent's digest must be that hash, its signed attributes'
 * messageDigest the SHA-256 of that content, and their RSA (PKCS#1 v1.5, SHA-256)
 * signature made by the certificate's key. Only a signature by that key itself counts (no
 * chains: sbsign with the db key is what image/secureboot.sh does). */
#ifndef KILN_IMAGE_AUTHENTICODE_H
#define KILN_IMAGE_AUTHENTICODE_H

#include <stddef.h>
#include <stdint.h>

/* The PE image is the n bytes at off in fd; cert is a PEM (NUL-terminated, len counting
 * the NUL) or DER X.509 certificate. 0 when one of its signatures is by cert's key;
 * -EPERM (not signed by it, or the hash differs), -EINVAL (not a PE image, a malformed
 * signature), -errno (read); err says which. */
int ac_verify(int fd, uint64_t off, uint64_t n, const unsigned char *cert, size_t len, char *err, size_t cap);

#endif
