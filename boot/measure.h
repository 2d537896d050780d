/* measure: measured boot. Once at boot, after the running slot was verified (boot/disk.h),
 * kiln-init extends PCR 15 of the TPM's SHA-256 bank with the SHA-256 of that slot's signed
 * manifest (its text as it is on the partition, the sig line included). The manifest names
 * every part's hash, so the PCR then says which signed image runs; a slot that did not
 * verify gets a second extend, SHA-256("kiln: the running slot did not verify"), so it can
 * never read like a good one. A box with no TPM is a normal case: said in `log` and by
 * `status`, nothing else changes.
 *
 * Why PCR 15: 0-7 are the firmware's; systemd-stub measures the UKI's sections into 11 (the
 * value systemd's signed PCR policies predict: another event there would break them), its
 * command line and credentials into 12, system extensions into 13; shim's MOK is 14.
 * 16 and 23 can be reset without a reboot (debug, application), so they prove nothing. 15
 * is the OS's and unused on this box (systemd userspace, which gives it the machine id,
 * does not run here). */
#ifndef KILN_BOOT_MEASURE_H
#define KILN_BOOT_MEASURE_H

#include <stddef.h>
#include <stdint.h>

#include "boot/disk.h"

#define MEAS_PCR 15

enum { MEAS_OFF, MEAS_NO_TPM, MEAS_NOTHING, MEAS_DONE, MEAS_FAILED };

typedef struct {
    int state;                 /* MEAS_* */
    int slot;                  /* the slot measured, -1 none */
    int unverified;            /* the "did not verify" event followed */
    char dev[64];              /* the TPM's device node */
    uint8_t event[32];         /* what was extended: the manifest's SHA-256 */
    uint8_t value[32];         /* PCR 15 read back after the extends */
    char why[200];             /* MEAS_FAILED, MEAS_NOTHING, MEAS_NO_TPM: why */
} meas;

/* Measures d's running slot (test mode: nothing, MEAS_OFF). Logs what it did. */
void meas_boot(meas *m, const dsk *d, int test_mode);
/* "measured: pcr15=<hex> (slot a's manifest sha256 <hex>)", or why not, for `status`. */
void meas_describe(const meas *m, char *out, size_t cap);

#endif
