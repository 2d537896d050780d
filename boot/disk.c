/* disk: see disk.h. */
#include "boot/disk.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include "boot/logring.h"
#include "boot/util.h"
#include "image/authenticode.h"
#include "image/bundle.h"
#include "image/manifest.h"
#include "pubkey.h" /* BUILD/keys/pubkey.h (kiln-image pubkey-c): IMG_PUBKEY_BYTES */
#include "sbcert.h" /* BUILD/keys/sbcert.h: IMG_SB_DB_CERT, the Secure Boot db certificate */

/* The image signing key's public half: `slot` boots nothing it does not verify. */
static const uint8_t pubkey[MAN_PUB_LEN] = IMG_PUBKEY_BYTES;
/* The UKI must also be signed for Secure Boot by db (what the firmware will check): a
 * network update whose UKI it would refuse is never activated. */
static const char sb_db_cert[] = IMG_SB_DB_CERT;

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

/* ------------------------------------------------------------------ slots */

#define EFI_LOADER_GUID "4a67b082-0a4c-41cf-b6c7-440b29bb8c4f"

/* The entry systemd-boot booted (its LoaderEntrySelected variable), ASCII. */
static int loader_entry(char *out, size_t cap) {
    out[0] = 0;
    if (mount("efivarfs", "/sys/firmware/efi/efivars", "efivarfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0 && errno != EBUSY)
        return -errno;
    int fd = open("/sys/firmware/efi/efivars/LoaderEntrySelected-" EFI_LOADER_GUID, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -errno;
    unsigned char buf[4 + 256];
    ssize_t n = read(fd, buf, sizeof buf);
    close(fd);
    if (n < 6) return -EINVAL;
    size_t j = 0;
    for (ssize_t i = 4; i + 1 < n && j + 1 < cap; i += 2) { /* 4 bytes of attributes, then UTF-16LE */
        unsigned c = buf[i] | (unsigned)buf[i + 1] << 8;
        if (!c) break;
        out[j++] = c < 128 ? (char)c : '?';
    }
    out[j] = 0;
    return 0;
}

#define EFI_GLOBAL_GUID "8be4df61-93ca-11d2-aa0d-00e098032b8c"

/* The firmware's SecureBoot variable (efivarfs, mounted by loader_entry): 1 when the
 * firmware enforces Secure Boot (it verified systemd-boot, which had it verify this UKI),
 * 0 when not, -errno when unreadable (a firmware without it: off). */
static int secure_boot(void) {
    int fd = open("/sys/firmware/efi/efivars/SecureBoot-" EFI_GLOBAL_GUID, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -errno;
    unsigned char buf[8];
    ssize_t n = read(fd, buf, sizeof buf);
    int e = errno;
    close(fd);
    if (n < 0) return -e;
    return n == 5 ? buf[4] == 1 : -EINVAL; /* 4 bytes of attributes, then one byte */
}

/* "version N" from the manifest at the start of a slot partition; 0 if none. */
static unsigned slot_version(const char *part) {
    char dev[64], buf[4097];
    if (disk_find_part(part, dev, sizeof dev) < 0) return 0;
    int fd = open(dev, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    if (strncmp(buf, "kiln-manifest 1\nversion ", 24)) return 0;
    unsigned long v = strtoul(buf + 24, NULL, 10);
    return v > 0xffffffffUL ? 0 : (unsigned)v;
}

static int tries_left(const char *entry) {
    const char *plus = strchr(entry, '+');
    return plus ? atoi(plus + 1) : -1;
}

static int tries_done(const char *entry) {
    const char *plus = strchr(entry, '+'), *minus = plus ? strchr(plus, '-') : NULL;
    return minus ? atoi(minus + 1) : 0;
}

static void scan_esp(dsk *d) {
    d->entry[0][0] = d->entry[1][0] = 0;
    DIR *dir = opendir(DISK_ESP_DIR "/EFI/Linux");
    if (!dir) return;
    struct dirent *e;
    while ((e = readdir(dir))) {
        for (int i = 0; i < 2; i++) {
            char pre[8];
            snprintf(pre, sizeof pre, "kiln-%c", 'a' + i);
            if (!strncmp(e->d_name, pre, 6) && (e->d_name[6] == '.' || e->d_name[6] == '+') &&
                strlen(e->d_name) < sizeof d->entry[i])
                memcpy(d->entry[i], e->d_name, strlen(e->d_name) + 1);
        }
    }
    closedir(dir);
}

static int verify_slot(const dsk *d, int slot, char *out, size_t cap);

/* Read apart from the check: a slot that does not verify still has its manifest measured
 * (and the failure after it). */
int disk_manifest_digest(int slot, uint8_t out[32], char *err, size_t cap) {
    char part[8], dev[64];
    static char text[MAN_MAX + 1]; /* PID 1: off the stack */
    man_manifest m;
    snprintf(part, sizeof part, "kiln-%c", 'a' + slot);
    int r = disk_find_part(part, dev, sizeof dev);
    if (r < 0) return snprintf(err, cap, "no %s partition", part), r;
    int fd = open(dev, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        r = -errno;
        snprintf(err, cap, "open %s: %s", dev, strerror(-r));
        return r;
    }
    r = bun_read_manifest(fd, 0, &m, text, err, cap);
    close(fd);
    if (r < 0) return r;
    man_sha s;
    man_sha_init(&s);
    man_sha_update(&s, text, strlen(text));
    man_sha_final(&s, out);
    return 0;
}

/* The running slot, checked once at boot as `slot` checks one (with Secure Boot off,
 * nothing else looks at the UKI systemd-boot loaded; with it on, the firmware checked the
 * UKI's signature, this checks the slot's bundle against the manifest key too). It booted
 * already, so a failure cannot stop it; it is said loudly, and a slot on trial that fails
 * is never blessed (its tries run out and the other slot boots again). */
static void verify_running(dsk *d) {
    char bad[400];
    double t0 = util_now();
    int me = d->slot;
    char err[300];
    if (disk_manifest_digest(me, d->manifest_sha256, err, sizeof err) == 0) d->have_manifest = 1;
    else logring_say("kiln-init: slot %c's manifest for measuring: %s", 'a' + me, err);
    if (verify_slot(d, me, bad, sizeof bad) == 0) {
        logring_say("kiln: slot %c (version %u) verified: signature, part hashes, its ESP entry (%.2f s)", 'a' + me,
                    d->version[me], util_now() - t0);
        return;
    }
    d->unverified = 1;
    logring_say("kiln: WARNING: the running slot %c does NOT verify: %s", 'a' + me, bad);
    logring_say("kiln: WARNING: it runs anyway%s;%s reflash it or update the other slot",
                d->secure_boot == 1 ? " (its UKI passed Secure Boot)" : " (no Secure Boot)", d->trial ? " on trial, it is never blessed;" : "");
}

static void setup_slots(dsk *d) {
    char dev[64], sel[128];
    d->slot = -1;
    if (disk_find_part("kiln-esp", dev, sizeof dev) < 0) return;
    if (mkdir(DISK_ESP_DIR, 0755) < 0 && errno != EEXIST) return;
    if (mount(dev, DISK_ESP_DIR, "vfat", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_NOATIME, NULL) < 0) {
        logring_say("kiln-init: mount %s (the ESP) on %s: %s", dev, DISK_ESP_DIR, strerror(errno));
        return;
    }
    d->esp_mounted = 1;
    d->version[0] = slot_version("kiln-a");
    d->version[1] = slot_version("kiln-b");
    scan_esp(d);
    int r = loader_entry(sel, sizeof sel);
    d->secure_boot = secure_boot();
    if (d->secure_boot == 1)
        logring_say("kiln: UEFI Secure Boot is on: the firmware verified systemd-boot and this UKI against its db");
    else
        logring_say("kiln: UEFI Secure Boot is off (%s): nothing verified the UKI before it ran",
                    d->secure_boot == 0 ? "SecureBoot = 0" : "no SecureBoot variable");
    if (r < 0) logring_say("kiln-init: which slot booted? LoaderEntrySelected: %s", strerror(-r));
    else if (!strncmp(sel, "kiln-a", 6) || !strncmp(sel, "kiln-b", 6)) d->slot = sel[5] - 'a';
    if (d->slot < 0) return;
    int me = d->slot, other = 1 - me;
    d->trial = strchr(d->entry[me], '+') != NULL;
    logring_say("kiln: slot %c, version %u%s", 'a' + me, d->version[me],
                d->trial ? " (on trial: blessed once healthy, else the other slot boots when its tries run out)" : "");
    verify_running(d);
    if (d->entry[other][0] && tries_left(d->entry[other]) == 0 && tries_done(d->entry[other]) > 0)
        logring_say("kiln: ROLLBACK: slot %c (version %u) failed its %d boot tries; back on slot %c (version %u)", 'a' + other,
                    d->version[other], tries_done(d->entry[other]), 'a' + me, d->version[me]);
}

#ifndef BLKGETSIZE64
#define BLKGETSIZE64 _IOR(0x12, 114, size_t)
#endif
#define DISK_EXT4_RESIZE _IOW('f', 16, uint64_t) /* EXT4_IOC_RESIZE_FS: online, to n blocks */

/* An ext4 superblock's block size and count (dev's bytes 1024..2047); 0 if not ext4. */
static uint64_t ext4_blocks(int fd, uint32_t *bs) {
    uint8_t sb[1024];
    if (pread(fd, sb, sizeof sb, 1024) != (ssize_t)sizeof sb || sb[56] != 0x53 || sb[57] != 0xEF) return 0;
    uint32_t lo = (uint32_t)sb[4] | (uint32_t)sb[5] << 8 | (uint32_t)sb[6] << 16 | (uint32_t)sb[7] << 24;
    uint32_t hi = (uint32_t)sb[0x150] | (uint32_t)sb[0x151] << 8 | (uint32_t)sb[0x152] << 16 | (uint32_t)sb[0x153] << 24;
    int wide = sb[0x60] & 0x80; /* INCOMPAT_64BIT */
    if (sb[24] > 6) return 0;
    *bs = 1024u << sb[24];
    return (uint64_t)lo | (wide ? (uint64_t)hi << 32 : 0);
}

/* kiln-flash install spans a disk larger than the image with kiln-data (its GPT grown):
 * the file system grows into the partition, online, by ext4's own resize in the kernel
 * (no tool in the image). Short of a MiB more there is nothing to do; a resize that fails
 * leaves the file system as it was, said, and the box serves from it. */
static void grow_data(const dsk *d) {
    int fd = open(d->data_dev, O_RDONLY | O_CLOEXEC);
    uint64_t bytes = 0, now;
    uint32_t bs = 0;
    if (fd < 0 || ioctl(fd, BLKGETSIZE64, &bytes) < 0 || !(now = ext4_blocks(fd, &bs))) {
        if (fd >= 0) close(fd);
        return;
    }
    close(fd);
    uint64_t want = bytes / bs;
    if (want <= now || (want - now) * bs < (1u << 20)) return;
    int dir = open(DISK_DATA_DIR, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir >= 0 && ioctl(dir, DISK_EXT4_RESIZE, &want) == 0)
        logring_say("kiln: data partition: its file system grew from %llu to %llu MiB (the partition's size)",
                    (unsigned long long)(now * bs >> 20), (unsigned long long)(want * bs >> 20));
    else
        logring_say("kiln-init: data partition: growing its file system from %llu to %llu MiB failed: %s",
                    (unsigned long long)(now * bs >> 20), (unsigned long long)(want * bs >> 20), strerror(errno));
    if (dir >= 0) close(dir);
}

void disk_setup(dsk *d, double wait_s) {
    memset(d, 0, sizeof *d);
    d->slot = -1;
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
            if (i == 0) grow_data(d);
            setup_slots(d);
            d->trial_deadline = util_now() + DISK_TRIAL_S;
            return;
        }
    }
    logring_say("kiln-init: mount %s on %s: %s (the model there is out of reach)", d->data_dev, DISK_DATA_DIR, strerror(errno));
}

void disk_describe(const dsk *d, char *out, size_t cap) {
    struct statvfs v;
    if (d->data_mounted && statvfs(DISK_DATA_DIR, &v) == 0)
        snprintf(out, cap, "data: %s on %s, %llu MiB, %llu free", d->data_dev, DISK_DATA_DIR,
                 (unsigned long long)((uint64_t)v.f_blocks * v.f_frsize >> 20),
                 (unsigned long long)((uint64_t)v.f_bavail * v.f_frsize >> 20));
    else if (d->data_mounted) snprintf(out, cap, "data: %s on %s", d->data_dev, DISK_DATA_DIR);
    else if (d->data_dev[0]) snprintf(out, cap, "data: %s not mounted (see `log`)", d->data_dev);
    else snprintf(out, cap, "data: none (no kiln-data partition)");
}

int disk_tick(dsk *d, int ready, int healthy, int safe, double now) {
    if (!d->trial || d->blessed || d->slot < 0) return 0;
    int me = d->slot;
    if (ready && !healthy && !d->said_waiting) {
        d->said_waiting = 1;
        logring_say("kiln: slot %c (version %u) on trial is ready; blessed once it has served a GEN (within %.0f s)", 'a' + me,
                    d->version[me], d->trial_deadline - now > 0 ? d->trial_deadline - now : 0);
    }
    if (healthy && d->unverified) { /* healthy, but not what was signed: its tries run out */
        if (!d->said_unverified++)
            logring_say("kiln: slot %c (version %u) is healthy but did not verify at boot: not blessed", 'a' + me, d->version[me]);
        healthy = 0;
    }
    if (healthy) {
        char from[UTIL_PATH_MAX], to[UTIL_PATH_MAX];
        snprintf(from, sizeof from, DISK_ESP_DIR "/EFI/Linux/%s", d->entry[me]);
        snprintf(to, sizeof to, DISK_ESP_DIR "/EFI/Linux/kiln-%c.efi", 'a' + me);
        d->blessed = 1;
        if (rename(from, to) < 0) {
            logring_say("kiln-init: blessing slot %c: rename %s: %s", 'a' + me, from, strerror(errno));
            return 0;
        }
        sync();
        snprintf(d->entry[me], sizeof d->entry[me], "kiln-%c.efi", 'a' + me);
        d->trial = 0;
        logring_say("kiln: slot %c (version %u) is healthy: blessed", 'a' + me, d->version[me]);
        return 0;
    }
    if (safe || now >= d->trial_deadline) {
        d->blessed = 1; /* once */
        const char *reason = safe ? "safe mode" : d->unverified ? "it did not verify at boot"
                          : ready ? "ready, but no GEN served in time" : "not ready in time";
        logring_say("kiln: slot %c (version %u) on trial is not healthy (%s): rebooting for its next try", 'a' + me,
                    d->version[me], reason);
        return 1;
    }
    return 0;
}

void disk_version(const dsk *d, char *out, size_t cap) {
    if (d->slot < 0) {
        snprintf(out, cap, "not booted from an A/B disk image (no slot)");
        return;
    }
    int me = d->slot, other = 1 - me;
    char o[96];
    if (d->version[other]) snprintf(o, sizeof o, "version %u (%s)", d->version[other], d->entry[other][0] ? d->entry[other] : "no boot entry");
    else snprintf(o, sizeof o, "empty");
    snprintf(out, cap, "running: slot %c, version %u%s\nother:   slot %c, %s", 'a' + me, d->version[me],
             d->trial ? " (on trial)" : "", 'a' + other, o);
}

static int why(char *out, size_t cap, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int why(char *out, size_t cap, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out, cap, fmt, ap);
    va_end(ap);
    return code;
}

/* Slot's bundle on its partition: signature with the built-in key, every part's size and
 * hash (image/bundle.c), and its UKI's Secure Boot signature by the built-in db
 * certificate (image/authenticode.c). 0 with *m, or -errno with why in out. */
static int verify_part(int slot, man_manifest *m, char *out, size_t cap) {
    char part[8], dev[64], err[300];
    snprintf(part, sizeof part, "kiln-%c", 'a' + slot);
    int r = disk_find_part(part, dev, sizeof dev);
    if (r < 0) return why(out, cap, r, "no %s partition", part);
    int fd = open(dev, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return why(out, cap, -errno, "open %s: %s", dev, strerror(errno));
    off_t size = lseek(fd, 0, SEEK_END);
    if (size < 0) {
        r = -errno;
        close(fd);
        return why(out, cap, r, "%s: size: %s", dev, strerror(-r));
    }
    r = bun_verify(fd, 0, (uint64_t)size, pubkey, m, err, sizeof err);
    for (int i = 0; r == 0 && i < m->nparts; i++)
        if (!strcmp(m->parts[i].name, "uki") &&
            (r = ac_verify(fd, bun_part_offset(m, i), m->parts[i].size, (const unsigned char *)sb_db_cert, sizeof sb_db_cert, err,
                           sizeof err)) < 0) {
            close(fd);
            return why(out, cap, r, "%s (%s): `uki` is not signed for Secure Boot by the db key: %s", part, dev, err);
        }
    close(fd);
    return r < 0 ? why(out, cap, r, "%s (%s): %s", part, dev, err) : 0;
}

/* The slot's partition (verify_part), then its ESP entry, the file systemd-boot would boot:
 * exactly the manifest's `uki` part. 0, or -errno with why in out. */
static int verify_slot(const dsk *d, int slot, char *out, size_t cap) {
    char path[UTIL_PATH_MAX], err[300];
    man_manifest m;
    int r = verify_part(slot, &m, out, cap);
    if (r < 0) return r;
    if (m.version != d->version[slot])
        return why(out, cap, -ESTALE, "kiln-%c: version %u verified, %u read at boot (changed since?)", 'a' + slot, m.version,
                   d->version[slot]);
    const man_part *uki = man_find(&m, "uki");
    if (!uki) return why(out, cap, -EINVAL, "kiln-%c: the manifest has no `uki` part", 'a' + slot);
    snprintf(path, sizeof path, DISK_ESP_DIR "/EFI/Linux/%s", d->entry[slot]);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return why(out, cap, -errno, "open %s: %s", path, strerror(errno));
    r = bun_check_copy(fd, uki, err, sizeof err);
    close(fd);
    if (r < 0) return why(out, cap, r, "ESP entry %s: %s", d->entry[slot], err);
    return 0;
}

int disk_switch(dsk *d, int slot, char *out, size_t cap) {
    if (!d->esp_mounted || d->slot < 0) return snprintf(out, cap, "not booted from an A/B disk image"), -ENODEV;
    if (slot == d->slot && d->trial)
        return snprintf(out, cap, "slot %c is running on trial: it is blessed once healthy, or the other slot boots when its tries run out",
                        'a' + slot), -EALREADY;
    if (!d->entry[slot][0] || !d->version[slot]) return snprintf(out, cap, "slot %c has no image to boot", 'a' + slot), -ENOENT;
    char bad[400];
    double t0 = util_now();
    int r = verify_slot(d, slot, bad, sizeof bad);
    if (r < 0) return why(out, cap, r, "REFUSED: slot %c does not verify, nothing changed: %s", 'a' + slot, bad);
    logring_note("kiln-init: slot %c (version %u) verified in %.2f s", 'a' + slot, d->version[slot], util_now() - t0);
    char from[UTIL_PATH_MAX], to[UTIL_PATH_MAX];
    int other = 1 - slot;
    /* The target slot's entry loses any counter; the other one is "no tries left": still a
     * fallback, sorted after every entry that has tries. */
    snprintf(from, sizeof from, DISK_ESP_DIR "/EFI/Linux/%s", d->entry[slot]);
    snprintf(to, sizeof to, DISK_ESP_DIR "/EFI/Linux/kiln-%c.efi", 'a' + slot);
    if (strcmp(from, to) && rename(from, to) < 0) return why(out, cap, -errno, "rename %s: %s", from, strerror(errno));
    snprintf(d->entry[slot], sizeof d->entry[slot], "kiln-%c.efi", 'a' + slot);
    if (d->entry[other][0]) {
        snprintf(from, sizeof from, DISK_ESP_DIR "/EFI/Linux/%s", d->entry[other]);
        snprintf(to, sizeof to, DISK_ESP_DIR "/EFI/Linux/kiln-%c+0.efi", 'a' + other);
        if (strcmp(from, to) && rename(from, to) < 0) return why(out, cap, -errno, "rename %s: %s", from, strerror(errno));
        snprintf(d->entry[other], sizeof d->entry[other], "kiln-%c+0.efi", 'a' + other);
    }
    sync();
    if (slot == d->slot) snprintf(out, cap, "slot %c (version %u, signature and hashes good) is running and boots next", 'a' + slot, d->version[slot]);
    else snprintf(out, cap, "slot %c (version %u, signature and hashes good) boots next; `reboot` to switch", 'a' + slot, d->version[slot]);
    return 0;
}

/* ------------------------------------------------------------------ network update */

/* The slot a network update may write: the one not running, with the running one blessed
 * (while it is on trial the other slot is its fallback). 0, or -errno with why. */
static int update_target_ok(const dsk *d, int slot, char *out, size_t cap) {
    if (!d->esp_mounted || d->slot < 0) return why(out, cap, -ENODEV, "not booted from an A/B disk image");
    if (slot != 1 - d->slot) return why(out, cap, -EPERM, "slot %c is the running slot: it is never written", 'a' + d->slot);
    if (d->trial)
        return why(out, cap, -EBUSY, "slot %c runs on trial: slot %c is its fallback until it is blessed (after a GEN)", 'a' + d->slot,
                   'a' + slot);
    return 0;
}

int disk_update_begin(dsk *d, int slot, char *out, size_t cap) {
    int r = update_target_ok(d, slot, out, cap);
    if (r < 0) return r;
    if (d->entry[slot][0]) { /* before the first byte: a half-written slot is never bootable */
        char path[UTIL_PATH_MAX];
        snprintf(path, sizeof path, DISK_ESP_DIR "/EFI/Linux/%s", d->entry[slot]);
        if (unlink(path) < 0 && errno != ENOENT) return why(out, cap, -errno, "unlink %s: %s", path, strerror(errno));
        sync();
    }
    logring_say("kiln: network update: slot %c's boot entry %s removed, kilnd writes the slot (slot %c runs, untouched)", 'a' + slot,
                d->entry[slot][0] ? d->entry[slot] : "(none)", 'a' + d->slot);
    d->entry[slot][0] = 0;
    d->version[slot] = 0;
    return 0;
}

/* The UKI (part ui of m, in the slot's partition) onto the ESP as name: through a temporary
 * file that systemd-boot ignores, checked against the manifest, then renamed. */
static int install_uki(int slot, const man_manifest *m, int ui, const char *name, char *out, size_t cap) {
    char part[8], dev[64], tmp[UTIL_PATH_MAX], dst[UTIL_PATH_MAX], err[300];
    snprintf(part, sizeof part, "kiln-%c", 'a' + slot);
    int r = disk_find_part(part, dev, sizeof dev);
    if (r < 0) return why(out, cap, r, "no %s partition", part);
    snprintf(tmp, sizeof tmp, DISK_ESP_DIR "/EFI/Linux/.kiln-%c.new", 'a' + slot);
    snprintf(dst, sizeof dst, DISK_ESP_DIR "/EFI/Linux/%s", name);
    int src = open(dev, O_RDONLY | O_CLOEXEC);
    if (src < 0) return why(out, cap, -errno, "open %s: %s", dev, strerror(errno));
    int fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        r = -errno;
        close(src);
        return why(out, cap, r, "create %s: %s", tmp, strerror(-r));
    }
    r = bun_copy(src, bun_part_offset(m, ui), fd, 0, m->parts[ui].size, err, sizeof err);
    if (r == 0) r = bun_check_copy(fd, &m->parts[ui], err, sizeof err);
    close(fd), close(src);
    if (r == 0 && rename(tmp, dst) < 0) r = -errno, snprintf(err, sizeof err, "rename to %s: %s", dst, strerror(errno));
    if (r < 0) unlink(tmp);
    sync();
    return r < 0 ? why(out, cap, r, "the UKI onto the ESP: %s", err) : 0;
}

int disk_activate(dsk *d, int slot, int tries, char *out, size_t cap) {
    char bad[400];
    man_manifest m;
    int r = update_target_ok(d, slot, out, cap);
    if (r < 0) return r;
    double t0 = util_now();
    if ((r = verify_part(slot, &m, bad, sizeof bad)) < 0) {
        logring_say("kiln: network update REFUSED: slot %c does not verify, nothing activated (slot %c runs, untouched): %s", 'a' + slot,
                    'a' + d->slot, bad);
        return why(out, cap, r, "slot %c does not verify: %s", 'a' + slot, bad);
    }
    const man_part *uki = man_find(&m, "uki");
    if (!uki) return why(out, cap, -EINVAL, "the manifest has no `uki` part");
    char name[64];
    snprintf(name, sizeof name, "kiln-%c+%d.efi", 'a' + slot, tries);
    if ((r = install_uki(slot, &m, (int)(uki - m.parts), name, bad, sizeof bad)) < 0) {
        logring_say("kiln: network update failed, nothing activated: %s", bad);
        return why(out, cap, r, "%s", bad);
    }
    d->version[slot] = m.version;
    snprintf(d->entry[slot], sizeof d->entry[slot], "%s", name);
    logring_say("kiln: network update: slot %c has version %u (signature and hashes good, %.2f s), boot entry %s: it boots next "
                "(%d tries; `reboot`)", 'a' + slot, m.version, util_now() - t0, name, tries);
    snprintf(out, cap, "version=%u tries=%d entry=%s", m.version, tries, name);
    return 0;
}

int disk_update_slot(const dsk *d, char *dev, size_t cap) {
    char part[8];
    if (!d->esp_mounted || d->slot < 0) return -1;
    snprintf(part, sizeof part, "kiln-%c", 'a' + (1 - d->slot));
    return disk_find_part(part, dev, cap) < 0 ? -1 : 1 - d->slot;
}
