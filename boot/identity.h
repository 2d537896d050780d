/* identity: the box's sealed identity, its TLS server key and its tokens file (the files
 * kiln.ini's [net] key and tokens_file name; and [net] cert beside them), kept on the data
 * partition so that only this box's TPM, running an image this box installed, can read
 * them; the image carries none (docs/IMAGE.md).
 *
 *   /data/provision/             kiln-flash --identity: server.key, server.crt, tokens.txt
 *   /data/identity/identity.enc  key and tokens, AES-256-GCM under a random 32-byte key K
 *   /data/identity/sealed-a|b    K sealed by the TPM (boot/tpm.h) to the value PCR 15 has
 *                                when that slot's image runs (boot/measure.h)
 *   /data/identity/server.crt    the certificate (public)
 *
 * First boot with a TPM (no identity.enc yet): the provisioned files are sealed (enrolment)
 * to the running slot, put in place from memory, and their plaintext destroyed (zeros
 * over each file, fsync, unlink, fsync the folder). Later boots: K is unsealed for the
 * running slot, the files are decrypted into /run/kiln/identity (tmpfs) and bind-mounted
 * over the paths kiln.ini names. When kiln-init itself makes a slot bootable (a network
 * update's activation, `slot`), it first verified that slot, and it seals K to the PCR 15
 * value that slot's manifest will give: an image put there any other way (kiln-flash, a
 * swapped disk) has no sealed K, or one it cannot unseal. Then, or on another box (another
 * TPM), or on a box whose TPM is gone, the console says so plainly and kiln-init holds the
 * box in safe mode (`restart` cannot override it): it does not serve with an identity it
 * cannot prove. No TPM and nothing sealed: the provisioned files serve from the data
 * partition, and the console says they are NOT sealed. Nothing sealed, provisioned or in
 * the image: safe mode, "no identity". Tokens provisioned without a key: the box makes its
 * own key and a self-signed certificate (keygen, the fingerprint on the console), then
 * as above. (An image that carries the files itself is enrolled from them, as before.) */
#ifndef KILN_BOOT_IDENTITY_H
#define KILN_BOOT_IDENTITY_H

#include <stddef.h>
#include <stdint.h>

#include "boot/disk.h"
#include "boot/measure.h"
#include "boot/util.h"

#define ID_DIR "/data/identity"
#define ID_PROV "/data/provision" /* kiln-flash --identity: server.key, server.crt, tokens.txt */
#define ID_RUN "/run/kiln/identity"
#define ID_FILE_MAX 16384 /* bytes of each file sealed */

enum { ID_OFF, ID_PLAIN, ID_ENROLLED, ID_UNSEALED, ID_FAILED };

typedef struct {
    int state;                        /* ID_* */
    int have_key;
    uint8_t key[32];                  /* K, kept to seal it for an updated slot */
    int capped;                       /* PCR 15 extended past every sealed value (cap_pcr) */
    uint8_t cap_value[32];            /* PCR 15 after that */
    char paths[3][UTIL_PATH_MAX];     /* the TLS server key, the tokens file, the certificate (kiln.ini) */
    char why[300];                    /* ID_FAILED: what the console says; ID_PLAIN, ID_OFF: why */
    char fp[100];                     /* a key made at this boot: its certificate's SHA-256, AA:BB:... */
    char ini[UTIL_PATH_MAX];          /* kiln.ini (a key made later, at `identity enrol`, names its address) */
} ident;

/* At boot, after meas_boot: enrols, or unseals and puts the files in place. ID_FAILED: the
 * caller holds the box in safe mode with why. */
void id_boot(ident *id, const dsk *d, const meas *m, const char *ini, int test_mode);
/* Seals K for slot (just verified) to the PCR 15 value its manifest gives. 0 (also when
 * there is no sealed identity to carry), or -errno with why in out. */
int id_seal_slot(ident *id, int slot, char *out, size_t cap);
/* The console's `identity enrol`: the provisioned identity sealed in place of the one this
 * box has (or failed to unseal: a moved disk), as at a first boot; the other slot's sealed
 * K goes (it is the old K). 0, or -errno; what happened in out either way. */
int id_enrol(ident *id, const dsk *d, const meas *m, char *out, size_t cap);
/* "identity: unsealed (...)" etc. for `status`. */
void id_describe(const ident *id, char *out, size_t cap);
/* dir's server.key, tokens.txt and server.crt overwritten with zeros, synced, unlinked;
 * dir synced and removed; parent synced. 0, or -errno with why. */
int id_wipe_dir(const char *dir, const char *parent, char *why, size_t cap);

#endif
