/* disk: the disk image's partitions as kiln-init sees them (docs/IMAGE.md). On a box booted
 * from the GPT disk image (`make disk`), the data partition (GPT name kiln-data) is mounted
 * on /data before kilnd starts: the model lives in /data/models, and /data/config/kiln.ini,
 * when present, is the configuration (`config set` then survives a reboot). A box booted
 * from the bare initramfs (no such partition) goes on without it.
 *
 * Partitions are found by their GPT names, which the kernel exports as PARTNAME in
 * /sys/class/block/<dev>/uevent. */
#ifndef KILN_BOOT_DISK_H
#define KILN_BOOT_DISK_H

#include <stddef.h>
#include <stdint.h>

#define DISK_DATA_DIR "/data"
#define DISK_CONFIG "/data/config/kiln.ini"

#ifndef DISK_ESP_DIR /* tests/boot/disk_tick_test.c points it elsewhere */
#define DISK_ESP_DIR "/run/kiln/esp"
#endif
#define DISK_TRIAL_S 180.0  /* a slot on trial not healthy by then reboots (its next try) */

typedef struct {
    int data_mounted;
    char data_dev[64];   /* "/dev/vda4", "" if none */
    /* A/B slots (docs/IMAGE.md): which one systemd-boot booted, their versions, their boot
     * entries on the ESP (EFI/Linux/kiln-<slot>[+LEFT[-DONE]].efi). */
    int esp_mounted;
    int slot;                    /* 0 = a, 1 = b, -1 unknown (not booted through systemd-boot) */
    unsigned version[2];         /* from each slot's manifest; 0 = empty or unreadable */
    char entry[2][64];           /* the ESP file names, "" if none */
    int trial;                   /* the booted entry is boot-counted: not blessed yet */
    int blessed;                 /* blessed in this boot (or given up on) */
    int said_waiting;            /* "ready; blessed after its first GEN" said */
    int secure_boot;             /* UEFI SecureBoot variable: 1 on, 0 off, < 0 unreadable */
    int unverified;              /* the running slot did not verify at boot: never blessed */
    int said_unverified;
    /* The running slot's manifest as it is on its partition (the bundle's first block up to
     * its NUL, the sig line included): what kiln-init measures into the TPM (boot/measure.h). */
    int have_manifest;
    uint8_t manifest_sha256[32];
    double trial_deadline;       /* util_now() */
} dsk;

/* The device node of the partition whose GPT name is name ("" and -ENOENT if none). */
int disk_find_part(const char *name, char *dev, size_t cap);
/* Looks for kiln-data (waiting up to wait_s for the block driver) and mounts it on /data. */
void disk_setup(dsk *d, double wait_s);
/* "data: /dev/vda4 on /data" or "data: none (...)" */
void disk_describe(const dsk *d, char *out, size_t cap);
/* Once the box is healthy (kilnd ready and one GEN served: sup_healthy), a slot on trial is
 * blessed (its entry loses the counter); ready alone is not enough. Returns 1 when the slot
 * on trial should give up this boot (not healthy by trial_deadline, or safe mode): the
 * caller reboots, and systemd-boot counts the try. */
int disk_tick(dsk *d, int ready, int healthy, int safe, double now);
/* `version` and `slot`: lines for the console. */
void disk_version(const dsk *d, char *out, size_t cap);
/* Makes slot (0/1) the one systemd-boot boots next: the other slot's entry is marked as
 * having no tries left (it stays as a fallback). Only after slot's bundle verifies (its
 * signature by the built-in key, every part's hash) and its ESP entry is the signed UKI;
 * else nothing changes. The running slot may be chosen again (undoes a `slot` to the other),
 * unless it is on trial. 0, or -errno with why in out. */
int disk_switch(dsk *d, int slot, char *out, size_t cap);

/* A network update (kilnd's UPDATE verb, docs/IMAGE.md) into slot, which must be the one
 * not running, with the running one blessed. begin: the slot's ESP entry is removed before
 * kilnd writes its first byte, so a half-written slot is never bootable. activate: the
 * bundle kilnd wrote into the partition verifies (built-in key, every hash), its UKI goes
 * onto the ESP as kiln-<slot>+<tries>.efi (read back and checked); out gets
 * "version=N tries=T entry=NAME". Else nothing is activated. 0, or -errno with why in out. */
int disk_update_begin(dsk *d, int slot, char *out, size_t cap);
int disk_activate(dsk *d, int slot, int tries, char *out, size_t cap);
/* The SHA-256 of slot's manifest text on its partition (what boot/measure.h measures);
 * not a verification. 0, or -errno with why in err. */
int disk_manifest_digest(int slot, uint8_t out[32], char *err, size_t cap);
/* The slot a network update writes (the one not running), -1 when none; dev its partition. */
int disk_update_slot(const dsk *d, char *dev, size_t cap);

#endif
