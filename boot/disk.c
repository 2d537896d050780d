/* disk: see disk.h. */
#include "boot/disk.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>

#include "boot/logring.h"
#include "boot/util.h"

int disk_find_part(const char *name, char *dev, size_t cap) {
    dev[0] = 0;
    DIR *dir = opendir("/sys/class/block");
    if (!dir) return -errno;
    struct dirent *e;
    int found = -ENOENT;
    while ((e = readdir(dir)) && found < 0) {
        if (e->d_name[0] == '.') continue;
        char path[UTIL_PATH_MAX], text[1024];
        if (snprintf(path, sizeof path, "/sys/class/block/%s/uevent", e->d_name) >= (int)sizeof path) continue;
        if (util_read_file(path, text, sizeof text) < 0) continue;
        char devname[64] = "", partname[80] = "";
        for (char *l = text, *nl; l && *l; l = nl) {
            if ((nl = strchr(l, '\n'))) *nl++ = 0;
            if (util_starts(l, "DEVNAME=")) snprintf(devname, sizeof devname, "%s", l + 8);
            else if (util_starts(l, "PARTNAME=")) snprintf(partname, sizeof partname, "%s", l + 9);
        }
        if (devname[0] && !strcmp(partname, name) && strchr(devname, '/') == NULL &&
            snprintf(dev, cap, "/dev/%s", devname) < (int)cap)
            found = 0;
    }
    closedir(dir);
    return found;
}

void disk_setup(dsk *d, double wait_s) {
    memset(d, 0, sizeof *d);
    double give_up = util_now() + wait_s;
    int r;
    /* The block driver registers its disks as its module loads; give a slow one a moment. */
    while ((r = disk_find_part("kiln-data", d->data_dev, sizeof d->data_dev)) < 0 && util_now() < give_up) util_sleep(0.1);
    if (r < 0) {
        logring_note("kiln-init: no kiln-data partition (not booted from the disk image)");
        return;
    }
    if (mkdir(DISK_DATA_DIR, 0755) < 0 && errno != EEXIST) {
        logring_say("kiln-init: mkdir %s: %s", DISK_DATA_DIR, strerror(errno));
        return;
    }
    static const char *const types[] = {"ext4", "vfat"};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        if (mount(d->data_dev, DISK_DATA_DIR, types[i], MS_NOSUID | MS_NODEV | MS_NOATIME, NULL) == 0) {
            d->data_mounted = 1;
            logring_say("kiln: data partition %s (%s) mounted on %s", d->data_dev, types[i], DISK_DATA_DIR);
            return;
        }
    }
    logring_say("kiln-init: mount %s on %s: %s (the model there is out of reach)", d->data_dev, DISK_DATA_DIR, strerror(errno));
}

void disk_describe(const dsk *d, char *out, size_t cap) {
    if (d->data_mounted) snprintf(out, cap, "data: %s on %s", d->data_dev, DISK_DATA_DIR);
    else if (d->data_dev[0]) snprintf(out, cap, "data: %s not mounted (see `log`)", d->data_dev);
    else snprintf(out, cap, "data: none (no kiln-data partition)");
}
