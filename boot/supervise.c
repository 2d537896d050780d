/* supervise: see supervise.h. */
#include "boot/supervise.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "boot/sys.h"

static void start_check(sup *s, double now);

const char *sup_state_name(sup_state st) {
    static const char *const names[] = {"idle", "checking the config", "starting", "running", "stopping",
                                        "backoff", "SAFE MODE", "stopped"};
    return (unsigned)st < sizeof names / sizeof names[0] ? names[st] : "?";
}

int sup_init(sup *s, const char *kilnd, const char *config, const char *sock, int test_mode,
             char *const *envp, const sigset_t *child_mask, initctl *c, double t0) {
    memset(s, 0, sizeof *s);
    if (strlen(kilnd) >= sizeof s->kilnd || strlen(config) >= sizeof s->config || strlen(sock) >= sizeof s->sock)
        return -ENAMETOOLONG;
    strcpy(s->kilnd, kilnd);
    strcpy(s->config, config);
    strcpy(s->sock, sock);
    strcpy(s->workdir, config);
    char *slash = strrchr(s->workdir, '/');
    if (slash && slash != s->workdir) *slash = 0;
    else strcpy(s->workdir, "/");
    s->test_mode = test_mode;
    s->envp = envp;
    s->child_mask = *child_mask;
    s->ctl = c;
    s->t0 = t0;
    s->log_fd = s->check_fd = -1;
    s->served = -1;
    s->backoff = SUP_BACKOFF_MIN_S;
    return 0;
}

/* ------------------------------------------------------------------ spawning */

/* The child's side of spawn(): never returns. Only async-signal-safe calls from here on. */
static void child(const sup *s, char *const argv[], int out) {
    setsid(); /* its own session: a console ^C or a kill of our group never reaches it */
    int null = open("/dev/null", O_RDONLY);
    if (null >= 0 && null != 0) dup2(null, 0), close(null);
    if (null < 0) close(0);
    dup2(out, 1);
    dup2(out, 2);
    if (out > 2) close(out);
    /* In test mode kiln-init is an ordinary process that can die; its kilnd must not stay. */
    if (s->test_mode) prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (chdir(s->workdir) < 0) dprintf(2, "kiln-init: chdir %s: %s\n", s->workdir, strerror(errno));
    signal(SIGPIPE, SIG_DFL);
    sigprocmask(SIG_SETMASK, &s->child_mask, NULL);
    execve(argv[0], argv, s->envp);
    dprintf(2, "kiln-init: cannot run %s: %s\n", argv[0], strerror(errno));
    _exit(127);
}

/* Forks argv with stdout+stderr into a new pipe; *rfd gets the pipe's read end. */
static pid_t spawn(const sup *s, char *const argv[], int *rfd) {
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0) return -errno;
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(p[0]), close(p[1]);
        return -e;
    }
    if (pid == 0) child(s, argv, p[1]);
    close(p[1]);
    if (util_nonblock(p[0]) < 0) logring_note("kiln-init: fcntl O_NONBLOCK on a pipe: %s", strerror(errno));
    *rfd = p[0];
    return pid;
}

/* Reads what a child wrote; at EOF closes the pipe. Bounded per call. */
static void read_pipe(int *fd, logring_splitter *sp, logring_emit emit, void *ctx) {
    char buf[4096];
    for (int i = 0; i < 8 && *fd >= 0; i++) {
        ssize_t n = read(*fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EAGAIN) return;
        if (n <= 0) {
            if (n < 0) logring_note("kiln-init: read a child's output: %s", strerror(errno));
            logring_split_flush(sp, emit, ctx);
            close(*fd);
            *fd = -1;
            return;
        }
        logring_split(sp, buf, (size_t)n, emit, ctx);
    }
}

/* After the child is reaped: take what is left in its pipe (it cannot grow any more,
 * unless the child left a grandchild holding it: the bound keeps us from waiting on that). */
static void drain_pipe(int *fd, logring_splitter *sp, logring_emit emit, void *ctx) {
    for (int i = 0; i < 16 && *fd >= 0; i++) read_pipe(fd, sp, emit, ctx);
    if (*fd >= 0) {
        logring_split_flush(sp, emit, ctx);
        close(*fd);
        *fd = -1;
    }
}

/* ------------------------------------------------------------------ output of the children */

/* Which kilnd lines also go to the console: the serving line and trouble. The rest is in
 * the ring for `log`. */
static int worth_echo(const char *line) {
    static const char *const words[] = {"error", "warn", "cannot", "failed", "fatal", "panic", NULL};
    if (util_starts(line, "kilnd: serving")) return 1;
    for (int i = 0; words[i]; i++)
        if (strcasestr(line, words[i])) return 1;
    return 0;
}

static void on_log_line(void *arg, const char *line) {
    sup *s = arg;
    if (!*line) return;
    snprintf(s->last_line, sizeof s->last_line, "%s", line);
    logring_add(line, worth_echo(line));
}

static void on_check_line(void *arg, const char *line) {
    sup *s = arg;
    if (!*line) return;
    if (!s->check_msg[0]) snprintf(s->check_msg, sizeof s->check_msg, "%s", line);
    logring_note("check-config: %s", line);
}

void sup_on_log(sup *s) { read_pipe(&s->log_fd, &s->log_sp, on_log_line, s); }
void sup_on_check(sup *s) { read_pipe(&s->check_fd, &s->check_sp, on_check_line, s); }

/* ------------------------------------------------------------------ state changes */

static void enter_safe(sup *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void enter_safe(sup *s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->reason, sizeof s->reason, fmt, ap);
    va_end(ap);
    s->state = SUP_SAFE;
    logring_say("kiln: SAFE MODE: %s", s->reason);
    logring_say("kiln: kilnd stays down; the console works: fix the cause (`log`, `config set`), then `restart`");
}

static void forget_history(sup *s) {
    memset(s->crash_t, 0, sizeof s->crash_t);
    memset(s->restart_t, 0, sizeof s->restart_t);
    s->crash_i = s->restart_i = 0;
    s->backoff = SUP_BACKOFF_MIN_S;
    s->reason[0] = 0;
}

/* Records t in a ring of n times; 1 if the ring is full and spans no more than window. */
static int too_many(double *ring, unsigned n, unsigned *i, double t, double window) {
    ring[*i % n] = t;
    (*i)++;
    if (*i < n) return 0;
    double oldest = ring[*i % n]; /* the slot written next holds the oldest time */
    return t - oldest <= window;
}

void sup_set_fallback(sup *s, const char *kilnd) {
    if (strlen(kilnd) < sizeof s->fallback) strcpy(s->fallback, kilnd);
}

/* The fallback takes kilnd's place (once): 1 when it did, and its check starts at once. */
static int fall_back(sup *s, double now, const char *why) {
    if (!s->fallback[0] || !strcmp(s->fallback, s->kilnd)) return 0;
    logring_say("kiln: %s cannot serve (%s): running %s instead", s->kilnd, why, s->fallback);
    strcpy(s->kilnd, s->fallback); /* same size */
    s->fallback[0] = 0;
    forget_history(s);
    start_check(s, now);
    return 1;
}

/* kilnd ended (or never started) without being asked to: back off, or give up. */
static void crashed(sup *s, double now, const char *why) {
    s->crashes++;
    if (too_many(s->crash_t, SUP_CRASH_LIMIT, &s->crash_i, now, SUP_CRASH_WINDOW_S)) {
        char what[200];
        snprintf(what, sizeof what, "crash loop: %d failures within %.0f s; last: %.120s", SUP_CRASH_LIMIT,
                 SUP_CRASH_WINDOW_S, why);
        if (fall_back(s, now, what)) return;
        enter_safe(s, "crash loop: %d failures within %.0f s; last: %s%s%.120s", SUP_CRASH_LIMIT, SUP_CRASH_WINDOW_S,
                   why, s->last_line[0] ? "; its last line: " : "", s->last_line);
        return;
    }
    s->state = SUP_BACKOFF;
    s->retry_at = now + s->backoff;
    logring_say("kiln: kilnd failed (%s); restarting in %.0f s", why, s->backoff);
    s->backoff = s->backoff * 2 > SUP_BACKOFF_MAX_S ? SUP_BACKOFF_MAX_S : s->backoff * 2;
}

static void start_serve(sup *s, double now) {
    char *argv[] = {s->kilnd, (char *)"serve", (char *)"--config", s->config, (char *)"--control", s->sock,
                    /* the inactive slot, for a network update (docs/IMAGE.md) */
                    s->update[0] ? (char *)"--update-slot" : NULL, s->update, NULL};
    /* A socket file left by the previous kilnd would only refuse connections; and a kilnd
     * that does not replace it could never listen. */
    if (unlink(s->sock) < 0 && errno != ENOENT) logring_note("kiln-init: unlink %s: %s", s->sock, strerror(errno));
    s->log_sp.len = 0, s->log_sp.cut = 0;
    s->last_line[0] = 0; /* a crash report quotes this kilnd's last line, not an older one's */
    pid_t pid = spawn(s, argv, &s->log_fd);
    if (pid < 0) {
        char why[160];
        snprintf(why, sizeof why, "cannot start it: fork/pipe: %s", strerror((int)-pid));
        crashed(s, now, why);
        return;
    }
    s->pid = pid;
    s->state = SUP_STARTING;
    s->spawned_at = s->next_connect = now;
    s->hb_seen = s->ready = s->killed = 0;
    s->served = -1;
    s->then = SUP_THEN_CRASH;
    s->starts++;
    logring_say("kiln: starting kilnd (pid %d)", (int)pid);
}

static void start_check(sup *s, double now) {
    char *argv[] = {s->kilnd, (char *)"check-config", (char *)"--config", s->config, NULL};
    s->check_msg[0] = 0;
    s->check_killed = 0;
    s->check_sp.len = 0, s->check_sp.cut = 0;
    pid_t pid = spawn(s, argv, &s->check_fd);
    if (pid < 0) {
        char why[160];
        snprintf(why, sizeof why, "cannot run check-config: fork/pipe: %s", strerror((int)-pid));
        crashed(s, now, why);
        return;
    }
    s->check_pid = pid;
    s->check_at = now;
    s->state = SUP_CHECKING;
}

void sup_start(sup *s, double now) {
    if (s->halting || s->pid > 0 || s->check_pid > 0) return;
    start_check(s, now);
}

/* kill() for kilnd only: pid 0 or -1 would signal our own group or everyone. */
static int signal_kilnd(sup *s, int sig) {
    if (s->pid <= 0) return -ESRCH;
    if (kill(s->pid, sig) == 0) return 0;
    int e = errno;
    logring_say("kiln-init: kill %d %s: %s", (int)s->pid, strsignal(sig), strerror(e));
    return -e;
}

static void kill_hard(sup *s, double now, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void kill_hard(sup *s, double now, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->kill_why, sizeof s->kill_why, fmt, ap);
    va_end(ap);
    logring_say("kiln: killing kilnd (pid %d): %s", (int)s->pid, s->kill_why);
    signal_kilnd(s, SIGKILL);
    s->killed = 1;
    s->kill_at = now;
}

/* ------------------------------------------------------------------ reaping */

static void check_exited(sup *s, int status, double now) {
    drain_pipe(&s->check_fd, &s->check_sp, on_check_line, s);
    s->check_pid = 0;
    if (s->halting) {
        s->state = s->pid > 0 ? s->state : SUP_DOWN;
        return;
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        start_serve(s, now);
        return;
    }
    char how[96];
    util_exit_text(status, how, sizeof how);
    int ran = WIFEXITED(status) && WEXITSTATUS(status) != 126 && WEXITSTATUS(status) != 127;
    if (!ran) {
        char what[200];
        snprintf(what, sizeof what, "its config check %.60s%s%.100s", how, s->check_msg[0] ? ": " : "", s->check_msg);
        if (fall_back(s, now, what)) return;
    }
    if (s->check_msg[0]) enter_safe(s, "config check failed: %s", s->check_msg);
    else enter_safe(s, "config check failed (%s, no message)", how);
}

static void serve_exited(sup *s, int status, double now) {
    drain_pipe(&s->log_fd, &s->log_sp, on_log_line, s);
    util_exit_text(status, s->last_exit, sizeof s->last_exit);
    s->exit_at = now;
    s->pid = 0; /* before initctl_close: its callbacks must not signal a reaped pid */
    initctl_close(s->ctl);
    int then = s->then, killed = s->killed;
    s->then = SUP_THEN_CRASH;
    s->killed = 0;
    s->ready = 0;
    s->served = -1;
    if (s->halting) {
        logring_say("kiln: kilnd stopped (%s)", s->last_exit);
        if (!s->check_pid) s->state = SUP_DOWN;
        return;
    }
    if (s->state == SUP_STOPPING && then == SUP_THEN_RESTART) {
        logring_say("kiln: kilnd stopped (%s); starting it again", s->last_exit);
        start_check(s, now);
        return;
    }
    if (!killed && WIFEXITED(status) && WEXITSTATUS(status) == SUP_EXIT_RESTART) {
        if (too_many(s->restart_t, SUP_RESTART_LIMIT, &s->restart_i, now, SUP_CRASH_WINDOW_S)) {
            enter_safe(s, "restart loop: kilnd asked for %d restarts within %.0f s", SUP_RESTART_LIMIT, SUP_CRASH_WINDOW_S);
            return;
        }
        logring_say("kiln: kilnd asked for a restart (exit %d); starting it again", SUP_EXIT_RESTART);
        start_check(s, now);
        return;
    }
    crashed(s, now, killed ? s->kill_why : s->last_exit);
}

int sup_reaped(sup *s, pid_t pid, int status, double now) {
    if (pid == s->check_pid && pid > 0) {
        check_exited(s, status, now);
        return 1;
    }
    if (pid == s->pid && pid > 0) {
        serve_exited(s, status, now);
        return 1;
    }
    return 0;
}

/* ------------------------------------------------------------------ events */

static void announce_ready(sup *s, double now) {
    if (!s->boot_ready_shown) {
        s->boot_ready_shown = 1;
        s->boot_ready_s = now - s->t0;
        logring_say("kiln: ready in %.2f s (boot to READY); kernel uptime %.2f s", now - s->t0, sys_uptime());
    } else {
        logring_say("kiln: kilnd ready again (start %u, %.2f s after it started)", s->starts, now - s->spawned_at);
    }
}

void sup_on_ctl(sup *s, int ev, double value, double now) {
    switch (ev) {
    case INITCTL_EV_HB:
        s->hb_at = now;
        s->hb_seen = 1;
        s->hb_n = (long)value;
        break;
    case INITCTL_EV_SERVED:
        if (s->pid > 0) s->served = (long long)value;
        break;
    case INITCTL_EV_LOOP:
        s->loop_max_ms = value;
        break;
    case INITCTL_EV_READY:
        s->hb_at = now;
        s->hb_seen = 1;
        if (s->ready) break;
        s->ready = 1;
        s->ready_at = now;
        if (s->state == SUP_STARTING) s->state = SUP_RUNNING;
        logring_note("kiln-init: kilnd READY (%.2f s by its clock)", value);
        announce_ready(s, now);
        break;
    case INITCTL_EV_UP:
        logring_note("kiln-init: connected to %s", s->sock);
        break;
    case INITCTL_EV_DOWN:
        if (s->pid > 0) logring_note("kiln-init: kilnd closed the control connection");
        break;
    }
}

/* ------------------------------------------------------------------ timers */

static double min2(double a, double b) { return a < b ? a : b; }

/* Liveness of a kilnd we have not killed yet: heartbeat, start, and stop deadlines. */
static void check_alive(sup *s, double now) {
    if (s->pid <= 0 || s->killed) return;
    if (s->hb_seen && now - s->hb_at > SUP_HB_TIMEOUT_S)
        kill_hard(s, now, "no heartbeat for %.1f s (hung)", now - s->hb_at);
    else if (!s->hb_seen && now - s->spawned_at > SUP_START_TIMEOUT_S)
        kill_hard(s, now, "no heartbeat within %.0f s of its start", SUP_START_TIMEOUT_S);
    else if (s->state == SUP_STOPPING && now - s->stop_at > SUP_STOP_TIMEOUT_S)
        kill_hard(s, now, "still running %.0f s after SIGTERM", SUP_STOP_TIMEOUT_S);
}

double sup_tick(sup *s, double now) {
    double next = 1e9;
    if (s->pid > 0 && !s->killed && !initctl_connected(s->ctl)) {
        if (now >= s->next_connect) {
            int r = initctl_connect(s->ctl);
            if (r < 0) logring_note("kiln-init: connect %s: %s", s->sock, strerror(-r));
            s->next_connect = now + SUP_CONNECT_EVERY_S;
        }
        next = min2(next, s->next_connect - now);
    }
    check_alive(s, now);
    if (s->check_pid > 0 && !s->check_killed && now - s->check_at > SUP_CHECK_TIMEOUT_S) {
        snprintf(s->check_msg, sizeof s->check_msg, "check-config did not finish within %.0f s", SUP_CHECK_TIMEOUT_S);
        if (kill(s->check_pid, SIGKILL) < 0) logring_say("kiln-init: kill check-config: %s", strerror(errno));
        s->check_killed = 1;
    }
    if (s->state == SUP_BACKOFF && !s->halting) {
        if (now >= s->retry_at) start_check(s, now);
        else next = min2(next, s->retry_at - now);
    }
    if (s->state == SUP_RUNNING && s->backoff > SUP_BACKOFF_MIN_S && now - s->ready_at >= SUP_HEALTHY_S) {
        s->backoff = SUP_BACKOFF_MIN_S;
        logring_note("kiln-init: kilnd healthy for %.0f s: backoff reset", SUP_HEALTHY_S);
    }
    return next;
}

int sup_healthy(const sup *s) { return s->pid > 0 && !s->killed && s->ready && s->served >= 1; }

int sup_watchdog_ok(const sup *s, double now, char *why, size_t cap) {
    if (s->pid > 0 && s->killed && now - s->kill_at > SUP_KILL_GRACE_S) {
        snprintf(why, cap, "kilnd (pid %d) survives SIGKILL for %.0f s (stuck in the kernel?)", (int)s->pid, now - s->kill_at);
        return 0;
    }
    if (s->pid > 0 && !s->killed && s->hb_seen && (s->state == SUP_RUNNING || s->state == SUP_STARTING) &&
        now - s->hb_at >= SUP_HB_FRESH_S) {
        snprintf(why, cap, "kilnd heartbeat %.1f s old", now - s->hb_at);
        return 0;
    }
    return 1;
}

/* ------------------------------------------------------------------ admin requests */

static void restart_line(void *arg, const char *line) {
    sup *s = arg;
    if (util_starts(line, "error")) {
        s->restart_refused = 1;
        logring_say("kiln: kilnd refused `restart`: %.160s", line);
    }
}

static void restart_done(void *arg, int status) {
    sup *s = arg;
    if (s->pid <= 0 || s->state != SUP_STOPPING || s->killed) return;
    if (status == 0 && !s->restart_refused) return; /* it exits by itself (75) */
    logring_say("kiln: kilnd %s: sending SIGTERM", status == 0 ? "refused to restart" : "did not answer `restart`");
    signal_kilnd(s, SIGTERM);
}

/* Stops a running kilnd so that its exit leads to `then`: gracefully over the control
 * socket when it answers, else with SIGTERM (which also drains). */
static int stop_kilnd(sup *s, double now, int then) {
    s->state = SUP_STOPPING;
    s->stop_at = now;
    s->then = then;
    s->restart_refused = 0;
    if (then == SUP_THEN_RESTART && initctl_connected(s->ctl) &&
        initctl_request(s->ctl, "restart", SUP_CTL_TIMEOUT_S, restart_line, restart_done, s) == 0)
        return 1;
    signal_kilnd(s, SIGTERM);
    return 0;
}

void sup_restart(sup *s, double now, char *msg, size_t cap) {
    if (s->halting) {
        snprintf(msg, cap, "shutting down: no restart");
        return;
    }
    if (s->hold[0]) { /* nothing this boot can fix: the box does not serve */
        snprintf(msg, cap, "refused: safe mode for this boot: %s", s->hold);
        return;
    }
    switch (s->state) {
    case SUP_IDLE:
    case SUP_BACKOFF:
    case SUP_SAFE:
    case SUP_DOWN:
        forget_history(s);
        snprintf(msg, cap, "starting kilnd%s", s->state == SUP_SAFE ? " (leaving safe mode)" : "");
        start_check(s, now);
        break;
    case SUP_CHECKING:
        snprintf(msg, cap, "kilnd is being started already");
        break;
    case SUP_STARTING:
    case SUP_RUNNING:
        forget_history(s);
        if (stop_kilnd(s, now, SUP_THEN_RESTART)) snprintf(msg, cap, "asked kilnd to restart (graceful)");
        else snprintf(msg, cap, "control socket unavailable: sent SIGTERM to kilnd (pid %d)", (int)s->pid);
        break;
    case SUP_STOPPING:
        if (s->then != SUP_THEN_HALT) s->then = SUP_THEN_RESTART;
        snprintf(msg, cap, "kilnd is stopping already; it will be started again");
        break;
    }
}

void sup_shutdown(sup *s, double now) {
    if (s->halting) return;
    s->halting = 1;
    if (s->check_pid > 0 && kill(s->check_pid, SIGKILL) < 0) logring_note("kiln-init: kill check-config: %s", strerror(errno));
    if (s->pid > 0) {
        if (s->state != SUP_STOPPING) {
            logring_say("kiln: stopping kilnd (pid %d): it drains, up to %.0f s", (int)s->pid, SUP_STOP_TIMEOUT_S);
            stop_kilnd(s, now, SUP_THEN_HALT);
        }
        s->then = SUP_THEN_HALT;
    } else if (s->check_pid <= 0) {
        s->state = SUP_DOWN;
    }
}

int sup_down(const sup *s) { return s->halting && s->pid <= 0 && s->check_pid <= 0; }

void sup_enter_safe(sup *s, const char *reason) {
    s->halting = 0;
    enter_safe(s, "%s", reason);
}

void sup_hold(sup *s, const char *reason) {
    snprintf(s->hold, sizeof s->hold, "%s", reason);
    sup_enter_safe(s, reason);
}

void sup_unhold(sup *s) { s->hold[0] = 0; }

int sup_test_signal(sup *s, int sig) {
    if (s->pid <= 0) return -ESRCH;
    return signal_kilnd(s, sig);
}

/* ------------------------------------------------------------------ status */

/* Appends to a bounded text; once full, the rest is dropped. */
static void add(char *buf, size_t cap, size_t *used, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void add(char *buf, size_t cap, size_t *used, const char *fmt, ...) {
    if (*used + 1 >= cap) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *used, cap - *used, fmt, ap);
    va_end(ap);
    if (n > 0) *used = (size_t)n >= cap - *used ? cap - 1 : *used + (size_t)n;
}

void sup_describe(const sup *s, double now, char *buf, size_t cap) {
    size_t u = 0;
    buf[0] = 0;
    add(buf, cap, &u, "kilnd: %s", sup_state_name(s->state));
    if (s->pid > 0) add(buf, cap, &u, ", pid %d, up %.0f s", (int)s->pid, now - s->spawned_at);
    if (s->pid > 0 && s->hb_seen)
        add(buf, cap, &u, ", heartbeat %.1f s ago (#%ld, longest loop pass %.1f ms)", now - s->hb_at, s->hb_n,
            s->loop_max_ms);
    if (s->pid > 0 && s->served >= 0) add(buf, cap, &u, ", %lld GENs served", s->served);
    if (s->pid > 0 && !s->hb_seen) add(buf, cap, &u, ", no heartbeat yet");
    if (s->state == SUP_STARTING) add(buf, cap, &u, ", waiting for READY");
    if (s->killed) add(buf, cap, &u, ", killed: %s", s->kill_why);
    if (s->state == SUP_BACKOFF) add(buf, cap, &u, ", restarting in %.0f s", s->retry_at - now > 0 ? s->retry_at - now : 0);
    if (s->state == SUP_SAFE)
        add(buf, cap, &u, "\nsafe mode: %s%s", s->reason, s->hold[0] ? " (for this boot: `restart` cannot leave it)" : " (type `restart` to leave it)");
    add(buf, cap, &u, "\nstarts %u, failures %u", s->starts, s->crashes);
    if (s->last_exit[0]) add(buf, cap, &u, "; last exit: %s, %.0f s ago", s->last_exit, now - s->exit_at);
}
