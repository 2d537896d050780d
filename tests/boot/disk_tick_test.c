/* disk_tick_test: when kiln-init blesses a slot on trial (boot/disk.c disk_tick), on the
 * host: not while kilnd is only ready, yes once it is healthy (ready and one GEN served:
 * the entry kiln-b+2-1.efi becomes kiln-b.efi), a reboot for the next try when the trial
 * deadline passes with no GEN served or in safe mode, nothing for a blessed slot, never a
 * blessing for a slot that did not verify at boot. A network update's first step
 * (disk_update_begin): the other slot's entry goes, never the running one's, not while on
 * trial; activation without the slot's partition activates nothing. The ESP's EFI/Linux
 * is a folder under /tmp. Built with ASan+UBSan; run by init_test.sh. */
#define DISK_ESP_DIR "/tmp/kiln-disk-tick-test"
#include "boot/disk.c"

#include <stdio.h>

static int failed, passed;
#define CHECK(cond, what)                                                   \
    do {                                                                    \
        if (cond) passed++;                                                 \
        else failed++, fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, what); \
    } while (0)

static void sink(void *ctx, const char *line) { (void)ctx, printf("    | %s\n", line); }

static int exists(const char *name) {
    char p[UTIL_PATH_MAX];
    snprintf(p, sizeof p, DISK_ESP_DIR "/EFI/Linux/%s", name);
    return access(p, F_OK) == 0;
}

static void trial(dsk *d, double deadline) {
    memset(d, 0, sizeof *d);
    d->esp_mounted = 1, d->slot = 1, d->trial = 1;
    d->version[0] = 1, d->version[1] = 2;
    strcpy(d->entry[0], "kiln-a.efi");
    strcpy(d->entry[1], "kiln-b+2-1.efi");
    d->trial_deadline = deadline;
    char p[UTIL_PATH_MAX];
    snprintf(p, sizeof p, DISK_ESP_DIR "/EFI/Linux/kiln-b.efi");
    unlink(p);
    snprintf(p, sizeof p, DISK_ESP_DIR "/EFI/Linux/kiln-b+2-1.efi");
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) close(fd);
}

int main(void) {
    logring_init(util_now(), sink, NULL);
    if ((mkdir(DISK_ESP_DIR, 0755) < 0 && errno != EEXIST) || (mkdir(DISK_ESP_DIR "/EFI", 0755) < 0 && errno != EEXIST) ||
        (mkdir(DISK_ESP_DIR "/EFI/Linux", 0755) < 0 && errno != EEXIST)) {
        perror("mkdir " DISK_ESP_DIR);
        return 1;
    }
    dsk d;
    trial(&d, 100);
    CHECK(disk_tick(&d, 0, 0, 0, 10) == 0 && !d.blessed && d.trial, "not ready: nothing yet");
    CHECK(disk_tick(&d, 1, 0, 0, 20) == 0 && !d.blessed && d.said_waiting, "ready, no GEN served: not blessed, said so");
    CHECK(exists("kiln-b+2-1.efi") && !exists("kiln-b.efi"), "ready alone leaves the counted entry");
    CHECK(disk_tick(&d, 1, 1, 0, 30) == 0 && d.blessed && !d.trial, "ready and a GEN served: blessed");
    CHECK(!exists("kiln-b+2-1.efi") && exists("kiln-b.efi") && !strcmp(d.entry[1], "kiln-b.efi"), "the entry lost its counter");
    CHECK(disk_tick(&d, 0, 0, 1, 1000) == 0, "a blessed slot never reboots for a try");

    trial(&d, 100);
    CHECK(disk_tick(&d, 1, 0, 0, 99.9) == 0, "ready, no GEN, before the deadline: wait");
    CHECK(disk_tick(&d, 1, 0, 0, 100) == 1 && exists("kiln-b+2-1.efi"), "ready but no GEN by the deadline: reboot, not blessed");
    CHECK(disk_tick(&d, 1, 1, 0, 101) == 0 && exists("kiln-b+2-1.efi"), "once given up, a late GEN does not bless");

    trial(&d, 100);
    CHECK(disk_tick(&d, 0, 0, 0, 100) == 1, "never ready by the deadline: reboot");
    trial(&d, 100);
    CHECK(disk_tick(&d, 0, 0, 1, 5) == 1 && exists("kiln-b+2-1.efi"), "safe mode: reboot at once");

    trial(&d, 100);
    d.trial = 0;
    CHECK(disk_tick(&d, 0, 0, 1, 1000) == 0, "not on trial: never reboots");

    trial(&d, 100);
    unlink(DISK_ESP_DIR "/EFI/Linux/kiln-b+2-1.efi");
    CHECK(disk_tick(&d, 1, 1, 0, 30) == 0 && d.trial, "an entry that cannot be renamed stays on trial (said why)");

    trial(&d, 100);
    d.unverified = 1; /* the running slot did not verify at boot */
    CHECK(disk_tick(&d, 1, 1, 0, 30) == 0 && !d.blessed && exists("kiln-b+2-1.efi"), "unverified: healthy, still not blessed");
    CHECK(disk_tick(&d, 1, 1, 0, 100) == 1 && exists("kiln-b+2-1.efi"), "unverified: its try ends at the deadline");

    /* the network update: running slot b (blessed), slot a the target */
    char out[400];
    trial(&d, 100);
    CHECK(disk_update_begin(&d, 0, out, sizeof out) == -EBUSY && exists("kiln-b+2-1.efi"), "on trial: no update (slot a is the fallback)");
    d.trial = 0;
    int fd = open(DISK_ESP_DIR "/EFI/Linux/kiln-a.efi", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) close(fd);
    CHECK(disk_update_begin(&d, 1, out, sizeof out) == -EPERM && exists("kiln-b+2-1.efi"), "the running slot is never a target");
    CHECK(disk_update_begin(&d, 0, out, sizeof out) == 0 && !exists("kiln-a.efi") && !d.entry[0][0] && !d.version[0],
          "begin: the other slot's entry is gone before any byte");
    CHECK(disk_activate(&d, 0, 3, out, sizeof out) < 0 && !d.entry[0][0] && !exists("kiln-a+3.efi"),
          "activate without the slot's partition: refused, nothing activated");
    d.slot = -1;
    CHECK(disk_update_begin(&d, 0, out, sizeof out) == -ENODEV, "not booted from an A/B disk: no update");

    unlink(DISK_ESP_DIR "/EFI/Linux/kiln-b+2-1.efi");
    unlink(DISK_ESP_DIR "/EFI/Linux/kiln-b.efi");
    rmdir(DISK_ESP_DIR "/EFI/Linux"), rmdir(DISK_ESP_DIR "/EFI"), rmdir(DISK_ESP_DIR);
    printf("disk_tick_test: %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
