/* srv_update: the network update (UPDATE, REBOOT): a signed bundle's bytes into the inactive
 * slot, kiln-init asked to verify and activate it over the control socket. */
#include "net/srv_int.h"

/* UPDATE size=N sha256=HEX [tries=T] (admin): the bytes of a signed bundle go into the
 * inactive slot's partition (net/update.h), kiln-init verifies and activates it. The steps:
 * kiln-init is asked to remove the slot's boot entry (ASK update-begin), then `OK update`
 * and the client's N raw bytes (progress lines on the way), the hash compared, then
 * kiln-init is asked to verify and activate (ASK update-activate), and the session hears
 * `OK update done ...` or an ERR. Anything that breaks on the way activates nothing. */

static void update_reset(srv *s) {
    if (upd_busy(&s->up)) upd_abort(&s->up);
    if (s->up_sess) s->up_sess->raw_left = 0;
    s->up_state = UP_IDLE, s->up_sess = NULL, s->up_deadline_ms = 0;
}

static int update_ask_init(srv *s, const char *what) {
    char line[128];
    snprintf(line, sizeof line, "ASK %s", what);
    return s->notify ? s->notify(s->notify_ud, line) : 0;
}

/* The update failed: the session (if still there) hears why, the log says what is left:
 * before kiln-init said ready the slot may still have its entry (kiln-init refused: it
 * does), after that it has none. */
static void update_fail(srv *s, int code, const char *slug, const char *msg) {
    const char *left = s->up_state == UP_BEGIN ? (code == 422 ? "its boot entry unchanged" : "its boot entry perhaps removed")
                                               : "no boot entry";
    srv_log(s, CFG_LOG_WARN, "update refused: %s: nothing activated (slot %c: %s); the running slot is untouched", msg,
            s->up.slot, left);
    if (s->up_sess) sess_err(s->up_sess, "-", code, slug, msg);
    update_reset(s);
}

void verb_update(srv_sess *ss, const proto_line *l) {
    srv *s = ss->s;
    proto_update u;
    char err[256];
    if (proto_update_parse(l, &u, err, sizeof err) < 0) { sess_err(ss, "-", 400, "bad_request", err); return; }
    if (!upd_enabled(&s->up)) {
        sess_err(ss, "-", 501, "not_implemented", "no slot to update: not booted from an A/B disk image");
        return;
    }
    if (s->up_state != UP_IDLE) { sess_err(ss, "-", 409, "busy", "another update is in progress"); return; }
    int r = upd_open(&s->up, u.size, u.sha256, err, sizeof err);
    if (r < 0) {
        sess_err(ss, "-", r == -EFBIG ? 413 : 500, r == -EFBIG ? "too_long" : "internal", err);
        return;
    }
    char what[32];
    snprintf(what, sizeof what, "update-begin %c", s->up.slot);
    if (update_ask_init(s, what) <= 0) {
        upd_abort(&s->up);
        sess_err(ss, "-", 503, "unavailable", "no kiln-init on the control socket to activate an update");
        return;
    }
    /* From here the connection carries the bundle's bytes, not lines (sent after OK). */
    s->up_state = UP_BEGIN, s->up_sess = ss, s->up_tries = u.tries;
    s->up_deadline_ms = loop_now_ms() + SRV_UPD_BEGIN_MS;
    s->up_progress = SRV_UPD_PROGRESS;
    ss->raw_left = u.size;
    srv_log(s, CFG_LOG_INFO, "update: session %d sends %llu bytes for slot %c", ss->num, (unsigned long long)u.size, s->up.slot);
}

void update_data(srv_sess *ss, const char *p, size_t n) {
    srv *s = ss->s;
    char err[256];
    if (s->up_sess != ss || s->up_state != UP_DATA) { /* bytes before OK: they cannot be told from lines */
        if (s->up_sess == ss) update_fail(s, 400, "bad_request", "update bytes before OK update");
        ss->raw_left = 0;
        sess_close(ss);
        return;
    }
    if (upd_write(&s->up, p, n, err, sizeof err) < 0) {
        update_fail(s, 500, "internal", err);
        sess_close(ss); /* the rest of the bytes would be read as lines */
        return;
    }
    ss->raw_left -= n;
    if (s->up.done >= s->up_progress || !ss->raw_left) {
        sess_printf(ss, "UPDATE progress bytes=%llu total=%llu\n", (unsigned long long)s->up.done, (unsigned long long)s->up.size);
        while (s->up_progress <= s->up.done) s->up_progress += SRV_UPD_PROGRESS;
    }
    if (ss->raw_left) return;
    int64_t t0 = loop_now_ms();
    int r = upd_finish(&s->up, err, sizeof err); /* the device's sync: the one long call */
    if (r < 0) { update_fail(s, r == -EBADMSG ? 422 : 500, r == -EBADMSG ? "refused" : "internal", err); return; }
    char what[48];
    snprintf(what, sizeof what, "update-activate %c tries=%d", s->up.slot, s->up_tries);
    if (update_ask_init(s, what) <= 0) { update_fail(s, 503, "unavailable", "kiln-init left the control socket"); return; }
    s->up_state = UP_ACTIVATE;
    s->up_deadline_ms = loop_now_ms() + SRV_UPD_ACTIVATE_MS;
    sess_printf(ss, "UPDATE verifying slot=%c\n", s->up.slot);
    srv_log(s, CFG_LOG_INFO, "update: %llu bytes in slot %c (synced in %lld ms), sha256 good; kiln-init verifies",
            (unsigned long long)s->up.size, s->up.slot, (long long)(loop_now_ms() - t0));
}

/* The session goes: a transfer under way is over, and nothing is activated. */
void update_lost(srv_sess *ss) {
    srv *s = ss->s;
    if (s->up_sess != ss) return;
    if (s->up_state == UP_ACTIVATE) { /* all bytes are in: kiln-init's answer goes to the log */
        s->up_sess = NULL;
        return;
    }
    s->up_sess = NULL;
    char msg[160];
    snprintf(msg, sizeof msg, "session %d lost after %llu of %llu bytes", ss->num, (unsigned long long)s->up.done,
             (unsigned long long)s->up.size);
    update_fail(s, 0, NULL, msg);
}

void update_sweep(srv *s) {
    if (s->up_state != UP_BEGIN && s->up_state != UP_ACTIVATE) return;
    if (loop_now_ms() < s->up_deadline_ms) return;
    srv_sess *ss = s->up_sess;
    update_fail(s, 503, "unavailable", "kiln-init did not answer in time");
    if (ss) sess_close(ss); /* it may be sending bytes that are not lines */
}

int srv_update_answer(srv *s, const char *line) {
    char verdict[16], slot = 0;
    int used = 0;
    if (sscanf(line, "update %15s %c %n", verdict, &slot, &used) < 2 || slot != s->up.slot) return -ENOENT;
    const char *rest = used ? line + used : "";
    srv_sess *ss = s->up_sess;
    if (!strcmp(verdict, "ready") && s->up_state == UP_BEGIN) {
        s->up_state = UP_DATA;
        if (ss) sess_printf(ss, "OK update slot=%c max=%llu\n", s->up.slot, (unsigned long long)s->up.cap);
    } else if (!strcmp(verdict, "done") && s->up_state == UP_ACTIVATE) {
        unsigned version = 0;
        const char *v = strstr(rest, "version=");
        if (v) version = (unsigned)strtoul(v + 8, NULL, 10);
        srv_log(s, CFG_LOG_INFO, "update: slot %c verified and activated by kiln-init (%s); it boots next", s->up.slot, rest);
        if (ss) sess_printf(ss, "OK update done slot=%c version=%u tries=%d\n", s->up.slot, version, s->up_tries);
        update_reset(s);
    } else if (!strcmp(verdict, "refused") && (s->up_state == UP_BEGIN || s->up_state == UP_ACTIVATE)) {
        char msg[480];
        snprintf(msg, sizeof msg, "kiln-init: %s", rest);
        if (ss && s->up_state == UP_BEGIN) ss->raw_left = 0; /* no OK was sent: no bytes come */
        update_fail(s, 422, "refused", msg);
    } else {
        return -ENOENT;
    }
    srv_flush_dirty(s);
    return 0;
}

void srv_set_notify(srv *s, srv_notify_fn fn, void *ud) { s->notify = fn, s->notify_ud = ud; }

/* REBOOT (admin): kiln-init drains kilnd and reboots the box (into a slot just updated). */
void verb_reboot(srv_sess *ss, const proto_line *l) {
    (void)l;
    srv *s = ss->s;
    if (s->up_state != UP_IDLE) { sess_err(ss, "-", 409, "busy", "an update is in progress"); return; }
    if (update_ask_init(s, "reboot") <= 0) {
        sess_err(ss, "-", 503, "unavailable", "no kiln-init on the control socket to reboot the box");
        return;
    }
    srv_log(s, CFG_LOG_WARN, "REBOOT by session %d: kiln-init reboots the box", ss->num);
    sess_printf(ss, "OK rebooting\n");
}
