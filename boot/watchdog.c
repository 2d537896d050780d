/* watchdog: see watchdog.h. */
#include "boot/watchdog.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/watchdog.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "boot/logring.h"

void wdog_init(wdog *w, const char *path, int test_mode) {
    memset(w, 0, sizeof *w);
    w->fd = -1;
    w->append = test_mode;
    snprintf(w->path, sizeof w->path, "%s", path);
}

static void try_open(wdog *w, double now) {
    w->next_open = now + WDOG_RETRY_S;
    int flags = O_WRONLY | O_CLOEXEC | (w->append ? O_APPEND : 0);
    int fd;
    do fd = open(w->path, flags); while (fd < 0 && errno == EINTR);
    if (fd < 0) {
        if (errno != ENOENT) logring_note("kiln-init: watchdog: open %s: %s", w->path, strerror(errno));
        return;
    }
    w->fd = fd;
    int timeout = 0;
    if (ioctl(fd, WDIOC_GETTIMEOUT, &timeout) == 0)
        logring_say("kiln: watchdog %s armed (timeout %d s)", w->path, timeout);
    else
        logring_say("kiln: watchdog %s armed", w->path);
}

static void pet(wdog *w, double now) {
    /* Any write is a keepalive to the Linux watchdog API; a NUL is not the magic 'V'. */
    ssize_t r;
    do r = write(w->fd, "", 1); while (r < 0 && errno == EINTR);
    if (r < 0) {
        logring_note("kiln-init: watchdog: write: %s", strerror(errno));
        return;
    }
    w->last_pet = now;
    w->pets++;
}

double wdog_tick(wdog *w, double now, int ok, const char *why) {
    if (w->fd < 0) {
        if (now >= w->next_open) try_open(w, now);
        if (w->fd < 0) return w->next_open - now;
    }
    if (!ok) {
        if (!w->paused) logring_say("kiln: watchdog: not petting: %s", why);
        w->paused = 1;
        return WDOG_PET_S;
    }
    if (w->paused) logring_say("kiln: watchdog: petting again");
    w->paused = 0;
    if (now - w->last_pet >= WDOG_PET_S) pet(w, now);
    return w->last_pet + WDOG_PET_S - now;
}

const char *wdog_describe(const wdog *w, char *buf, size_t cap) {
    if (w->fd < 0) snprintf(buf, cap, "no watchdog device (%s)", w->path);
    else if (w->paused) snprintf(buf, cap, "%s armed, NOT petting (the board resets when it expires)", w->path);
    else snprintf(buf, cap, "%s armed, petted every %.0f s (%lu pets)", w->path, WDOG_PET_S, w->pets);
    return buf;
}
