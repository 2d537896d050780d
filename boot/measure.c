/* measure: see measure.h. */
#include "boot/measure.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "boot/logring.h"
#include "boot/tpm.h"
#include "image/manifest.h"

#define UNVERIFIED_EVENT "kiln: the running slot did not verify"

/* The failure of call, with the TPM's code when it gave one, into m->why. */
static void failed(meas *m, const tpm_dev *t, const char *call, int e) {
    char rc[80];
    m->state = MEAS_FAILED;
    if (e == -EIO) snprintf(m->why, sizeof m->why, "%s: the TPM says %s", call, tpm_rc_text(t->rc, rc, sizeof rc));
    else snprintf(m->why, sizeof m->why, "%s: %s", call, strerror(-e));
    logring_say("kiln: WARNING: measured boot: %s (TPM %s): the boot is not measured", m->why, m->dev);
}

void meas_boot(meas *m, const dsk *d, int test_mode) {
    memset(m, 0, sizeof *m);
    m->slot = -1;
    if (test_mode) {
        m->state = MEAS_OFF;
        snprintf(m->why, sizeof m->why, "test mode");
        return;
    }
    tpm_dev t;
    int e = tpm_open(&t, NULL);
    if (e < 0) {
        m->state = MEAS_NO_TPM;
        snprintf(m->why, sizeof m->why, e == -ENOENT ? "no /dev/tpmrm0 or /dev/tpm0" : "open: %s", strerror(-e));
        if (e == -ENOENT) logring_note("kiln-init: no TPM (%s): the boot is not measured", m->why);
        else logring_say("kiln: WARNING: measured boot: TPM %s: the boot is not measured", m->why);
        return;
    }
    snprintf(m->dev, sizeof m->dev, "%s", t.path);
    if ((e = tpm_startup(&t)) < 0) {
        failed(m, &t, "TPM2_Startup", e);
    } else if (d->slot < 0 || !d->have_manifest) {
        m->state = MEAS_NOTHING;
        snprintf(m->why, sizeof m->why, d->slot < 0 ? "not booted from an A/B disk image" : "the slot's manifest is unreadable");
        logring_say("kiln: TPM %s: nothing measured (%s)", m->dev, m->why);
    } else {
        uint8_t mark[32];
        man_sha s;
        man_sha_init(&s);
        man_sha_update(&s, UNVERIFIED_EVENT, strlen(UNVERIFIED_EVENT));
        man_sha_final(&s, mark);
        memcpy(m->event, d->manifest_sha256, 32);
        m->slot = d->slot;
        m->unverified = d->unverified;
        if ((e = tpm_pcr_extend(&t, MEAS_PCR, m->event)) < 0) failed(m, &t, "TPM2_PCR_Extend", e);
        else if (m->unverified && (e = tpm_pcr_extend(&t, MEAS_PCR, mark)) < 0) failed(m, &t, "TPM2_PCR_Extend", e);
        else if ((e = tpm_pcr_read(&t, MEAS_PCR, m->value)) < 0) failed(m, &t, "TPM2_PCR_Read", e);
        else m->state = MEAS_DONE;
    }
    tpm_close(&t);
    if (m->state != MEAS_DONE) return;
    char ev[65], val[65];
    man_hex(m->event, 32, ev);
    man_hex(m->value, 32, val);
    logring_say("kiln: measured boot: slot %c's manifest (sha256 %s) extended into PCR %d%s", 'a' + m->slot, ev, MEAS_PCR,
                m->unverified ? ", then the event that it did not verify" : "");
    logring_say("kiln: measured boot: pcr%d=%s (TPM %s)", MEAS_PCR, val, m->dev);
}

void meas_describe(const meas *m, char *out, size_t cap) {
    char ev[65], val[65];
    switch (m->state) {
    case MEAS_DONE:
        man_hex(m->event, 32, ev);
        man_hex(m->value, 32, val);
        snprintf(out, cap, "measured: pcr%d=%s (slot %c's manifest sha256 %s%s)", MEAS_PCR, val, 'a' + m->slot, ev,
                 m->unverified ? ", then: did not verify" : "");
        break;
    case MEAS_NO_TPM: snprintf(out, cap, "measured: no TPM (%s)", m->why); break;
    case MEAS_NOTHING: snprintf(out, cap, "measured: nothing (TPM %s; %s)", m->dev, m->why); break;
    case MEAS_FAILED: snprintf(out, cap, "measured: FAILED (TPM %s): %s", m->dev, m->why); break;
    default: snprintf(out, cap, "measured: off (%s)", m->why); break;
    }
}
