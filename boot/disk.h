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

#define DISK_DATA_DIR "/data"
#define DISK_CONFIG "/data/config/kiln.ini"

typedef struct {
    int data_mounted;
    char data_dev[64];   /* "/dev/vda4", "" if none */
} dsk;

/* The device node of the partition whose GPT name is name ("" and -ENOENT if none). */
int disk_find_part(const char *name, char *dev, size_t cap);
/* Looks for kiln-data (waiting up to wait_s for the block driver) and mounts it on /data. */
void disk_setup(dsk *d, double wait_s);
/* "data: /dev/vda4 on /data" or "data: none (...)" */
void disk_describe(const dsk *d, char *out, size_t cap);

#endif
