/* supervise: kilnd's life under kiln-init. Each start runs `kilnd check-config` first;
 * then `kilnd serve --config C --control S` with stdout and stderr into a pipe that goes to
 * the log ring. kilnd is restarted when it exits, after a backoff (1 s, 2 s, 4 s ... 30 s;
 * back to 1 s after 60 s of healthy running); exit status 75 (the admin's RESTART verb)
 * restarts at once and is not a crash. A crash loop or a config that does not check enters
 * safe mode: no more starts until the console's `restart`. A kilnd whose heartbeat (on the
 * control socket) stops is killed and restarted.
 *
 *   IDLE -> CHECKING -> STARTING -> RUNNING (READY) -> exit -> BACKOFF -> CHECKING ...
 *                 \-> SAFE (bad config)                  \-> SAFE (crash loop)
 *   restart/shutdown: RUNNING -> STOPPING -> CHECKING (restart) | DOWN (shutdown) */
#ifndef KILN_BOOT_SUPERVISE_H
#define KILN_BOOT_SUPERVISE_H

#include <signal.h>
#include <sys/types.h>

#include "boot/initctl.h"
#include "boot/logring.h"
#include "boot/util.h"

/* Timings, seconds. */
#define SUP_HB_TIMEOUT_S 5.0      /* heartbeat this old: kilnd is hung, SIGKILL it */
#define SUP_HB_FRESH_S 3.0        /* the hardware watchdog is petted while younger */
#define SUP_START_TIMEOUT_S 300.0 /* start to first heartbeat (model loading included) */
#define SUP_STOP_TIMEOUT_S 30.0   /* SIGTERM (kilnd drains) to SIGKILL */
#define SUP_KILL_GRACE_S 10.0     /* SIGKILL to exit; longer: unkillable, let the watchdog reset */
#define SUP_CHECK_TIMEOUT_S 60.0  /* check-config's run */
#define SUP_CONNECT_EVERY_S 0.1   /* control socket connection attempts */
#define SUP_BACKOFF_MIN_S 1.0
#define SUP_BACKOFF_MAX_S 30.0
#define SUP_HEALTHY_S 60.0        /* running this long resets the backoff */
#define SUP_CRASH_LIMIT 5         /* this many crashes ... */
#define SUP_CRASH_WINDOW_S 60.0   /* ... this close together: safe mode */
#define SUP_RESTART_LIMIT 10      /* exit-75 restarts within the window: a restart loop */
#define SUP_CTL_TIMEOUT_S 2.0     /* any control request */
#define SUP_EXIT_RESTART 75       /* kilnd's "restart me" exit status */

typedef enum { SUP_IDLE, SUP_CHECKING, SUP_STARTING, SUP_RUNNING, SUP_STOPPING, SUP_BACKOFF, SUP_SAFE, SUP_DOWN } sup_state;
enum { SUP_THEN_CRASH, SUP_THEN_RESTART, SUP_THEN_HALT }; /* what a STOPPING kilnd's exit leads to */

typedef struct {
    /* set up once */
    char kilnd[UTIL_PATH_MAX];   /* the binary */
    char fallback[UTIL_PATH_MAX]; /* run instead, once, when kilnd cannot run at all ("" none):
                                   * the GPU image's CPU kilnd behind its CUDA one (below) */
    char config[UTIL_PATH_MAX];  /* kiln.ini */
    char sock[108];              /* the control socket path */
    char workdir[UTIL_PATH_MAX]; /* kilnd's cwd: the config's folder, for relative paths */
    int test_mode;
    char *const *envp;           /* kilnd's environment */
    char update[96];             /* "b:/dev/vda3": the slot kilnd's UPDATE verb may write, "" none */
    sigset_t child_mask;         /* the signal mask kiln-init started with: children get it */
    initctl *ctl;
    double t0;                   /* kiln-init's start */

    sup_state state;
    pid_t pid;                   /* kilnd serve, 0 = none */
    pid_t check_pid;             /* kilnd check-config, 0 = none */
    int log_fd, check_fd;        /* their output pipes, -1 = closed */
    logring_splitter log_sp, check_sp;
    char check_msg[200];         /* check-config's first line of output */
    int check_killed;
    double spawned_at, ready_at, hb_at, check_at, retry_at, stop_at, kill_at, next_connect, exit_at;
    int hb_seen, ready, killed, then, restart_refused;
    long hb_n;                   /* the last heartbeat's counter */
    double loop_max_ms;          /* ... and kilnd's longest loop pass it reported */
    long long served;            /* GENs this kilnd finished (its HB's served=), -1 unknown */
    char kill_why[160];          /* why we SIGKILLed it */
    double backoff;              /* the next crash's delay */
    double crash_t[SUP_CRASH_LIMIT];   /* recent crash times, a ring */
    double restart_t[SUP_RESTART_LIMIT];
    unsigned crash_i, restart_i;
    unsigned starts, crashes;    /* since boot */
    char reason[256];            /* safe mode's */
    char hold[256];              /* safe mode no `restart` leaves (the identity did not unseal) */
    char last_exit[96];          /* "exit status 1" */
    char last_line[160];         /* kilnd's last line of output */
    int boot_ready_shown;
    double boot_ready_s;         /* kiln-init start to the first READY */
    int halting;                 /* shutting down: no more starts */
} sup;

int sup_init(sup *s, const char *kilnd, const char *config, const char *sock, int test_mode,
             char *const *envp, const sigset_t *child_mask, initctl *c, double t0);
void sup_start(sup *s, double now);
int sup_reaped(sup *s, pid_t pid, int status, double now); /* 1 if pid was one of ours */
double sup_tick(sup *s, double now);                        /* seconds until it wants the next tick */
void sup_on_ctl(sup *s, int ev, double value, double now);
void sup_on_log(sup *s);                                    /* s->log_fd readable */
void sup_on_check(sup *s);                                  /* s->check_fd readable */
void sup_restart(sup *s, double now, char *msg, size_t cap); /* the admin's restart; leaves safe mode */
void sup_shutdown(sup *s, double now);
int sup_down(const sup *s);                                 /* shutdown finished: no children */
int sup_watchdog_ok(const sup *s, double now, char *why, size_t cap);
/* kilnd is ready and has finished at least one GEN (a slot on trial is blessed on this) */
int sup_healthy(const sup *s);
void sup_describe(const sup *s, double now, char *buf, size_t cap); /* lines for `status` */
const char *sup_state_name(sup_state st);
int sup_test_signal(sup *s, int sig);                       /* test-kill / test-hang */
/* The fallback kilnd (set after sup_init): when kilnd's config check dies without saying
 * why (a signal, or exit 126/127: it could not be executed, e.g. a missing library) or kilnd
 * crash-loops, the fallback takes its place once, with a fresh history, instead of safe
 * mode. A check that fails with a message is the config's fault: safe mode as before. */
void sup_set_fallback(sup *s, const char *kilnd);
void sup_enter_safe(sup *s, const char *reason);            /* also ends a shutdown that failed */
void sup_hold(sup *s, const char *reason);                  /* safe mode for this whole boot */
void sup_unhold(sup *s);                                    /* its cause is gone (`identity enrol`): `restart` leaves safe mode again */

#endif
