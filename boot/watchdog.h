/* watchdog: the hardware watchdog (/dev/watchdog; i6300esb under QEMU). It protects the
 * box against kiln-init itself hanging, or against a kilnd that even SIGKILL cannot end
 * (stuck in a driver): the caller passes ok = 0 then and the board resets. A kilnd that
 * merely stops heartbeating is kiln-init's job (kill and restart), so ok stays 1 while
 * kiln-init handles it. Opening the device arms it; we never write the magic 'V', so a
 * kiln-init that dies also ends in a reset. */
#ifndef KILN_BOOT_WATCHDOG_H
#define KILN_BOOT_WATCHDOG_H

#include "boot/util.h"

#define WDOG_PET_S 1.0      /* seconds between pets */
#define WDOG_RETRY_S 10.0   /* seconds between looks for a device that is not there */

typedef struct {
    char path[UTIL_PATH_MAX];
    int fd;              /* -1: not open */
    int append;          /* test mode: the "device" is a file; pets append to it */
    int paused;          /* the last tick did not pet: logged once per pause */
    double last_pet, next_open; /* util_now() seconds */
    unsigned long pets;
} wdog;

void wdog_init(wdog *w, const char *path, int test_mode);
double wdog_tick(wdog *w, double now, int ok, const char *why); /* seconds to the next pet */
const char *wdog_describe(const wdog *w, char *buf, size_t cap);

#endif
