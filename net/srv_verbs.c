/* srv_verbs: the verb table: each protocol line goes to its verb (HELLO first; admin verbs
 * need an admin role), HEALTH, STATS, METRICS, QUIT, CONFIG and the other admin verbs. */
#include "net/srv_int.h"

static void verb_hello(srv_sess *ss, const proto_line *l) {
    proto_hello h;
    char err[256];
    srv *s = ss->s;
    int role = ROLE_NONE, tok = -1;
    if (proto_hello_parse(l, &h, err, sizeof err) == 0) role = srv_token_role(s, h.token, &tok);
    if (role == ROLE_NONE) {
        srv_log(s, CFG_LOG_INFO, "session %d: HELLO refused from %s", ss->num, ss->peer);
        sess_err(ss, "-", 401, "unauthorized", NULL);
        sess_close(ss);
        return;
    }
    if (sess_token_admit(ss, tok) < 0) {
        srv_log(s, CFG_LOG_INFO, "session %d: HELLO from %s: its token is at max_connections_per_token", ss->num, ss->peer);
        sess_err(ss, "-", 429, "too_many_connections", "this token holds max_connections_per_token connections, all busy");
        sess_close(ss);
        return;
    }
    ss->role = role, ss->state = SS_READY, ss->deadline_ms = 0;
    sess_printf(ss, "OK kiln/1 model=");
    sess_quote(ss, s->env.model_name, strlen(s->env.model_name));
    sess_printf(ss, " ctx=%d session=%d role=%s\n", s->env.max_seq_len, ss->num,
                role == ROLE_ADMIN ? "admin" : "user");
    if (s->draining) sess_goaway(ss); /* a box being drained sends newcomers on too */
}

static void verb_health(srv_sess *ss, const proto_line *l) {
    (void)l;
    char line[256];
    srv_health(ss->s, line, sizeof line);
    sess_printf(ss, "%s\n", line);
}

static void verb_stats(srv_sess *ss, const proto_line *l) {
    (void)l;
    char line[1024];
    srv_stats(ss->s, line, sizeof line);
    sess_printf(ss, "%s\n", line);
}

static void verb_config(srv_sess *ss, const proto_line *l) {
    srv *s = ss->s;
    const proto_str *k = proto_get(l, "key");
    if (!k) {
        static char dump[CFG_DUMP_MAX];
        int n = cfg_dump(&s->cfg, dump, sizeof dump);
        if (n < 0) { sess_err(ss, "-", 500, "internal", "config too large"); return; }
        sess_body(ss, dump, (size_t)n);
        return;
    }
    char out[CFG_STR_MAX + 1];
    int r = srv_config_get(s, k->s, out, sizeof out);
    if (r < 0) {
        sess_err(ss, "-", r == -EINVAL ? 400 : 404, r == -EINVAL ? "bad_request" : "not_found",
                 r == -EINVAL ? "key=section.name" : "no such key");
        return;
    }
    size_t n = strlen(out), bare = n > 0;
    for (size_t i = 0; i < n && bare; i++) /* a bare word when it can be one */
        bare = (unsigned char)out[i] > 0x20 && (unsigned char)out[i] < 0x7f && out[i] != '"' && out[i] != '=';
    sess_printf(ss, "CONFIG %s=", k->s);
    if (bare) sess_printf(ss, "%s", out);
    else sess_quote(ss, out, n);
    sess_printf(ss, "\n");
}

static void verb_drain(srv_sess *ss, const proto_line *l) {
    srv_set_draining(ss->s, !(l->n_pos == 1 && !strcmp(l->pos[0].s, "off")));
    sess_printf(ss, "OK draining=%d\n", ss->s->draining);
}

static void verb_ladder(srv_sess *ss, const proto_line *l) {
    srv *s = ss->s;
    const proto_str *lv = proto_get(l, "level");
    if (lv) {
        int want = !strcmp(lv->s, "auto") ? -1 : lv->len == 1 && lv->s[0] >= '0' && lv->s[0] <= '3'
                                                     ? lv->s[0] - '0' : -2;
        if (want == -2 || drive_ladder_pin(&s->drv, want) < 0) {
            sess_err(ss, "-", 400, "bad_request", "usage: LADDER [level=0|1|2|3|auto]");
            return;
        }
        srv_log(s, CFG_LOG_WARN, "ladder %s by session %d", want < 0 ? "back to automatic" : "pinned",
                ss->num);
    }
    const ladder *lad = &s->drv.lad;
    sess_printf(ss, "LADDER level=%d name=%s pinned=%d batch=%d pressure=%.3f kv8=%d kv8_blocks=%d\n",
                lad->level, ladder_names[lad->level], lad->pinned >= 0, lad->batch, lad->pressure,
                lad->cfg.has_kv8, kv_q8_blocks(s->env.kv));
}

static void verb_reload(srv_sess *ss, const proto_line *l) {
    (void)l;
    char err[256];
    int n = srv_reload(ss->s, err, sizeof err);
    if (n < 0) sess_err(ss, "-", 500, "internal", err);
    else sess_printf(ss, "OK tokens=%d\n", n);
}

static void verb_restart(srv_sess *ss, const proto_line *l) {
    (void)l;
    sess_printf(ss, "OK restarting\n");
    srv_drain(ss->s, 1);
}

static void verb_metrics(srv_sess *ss, const proto_line *l) {
    (void)l;
    int n = srv_render_metrics(ss->s);
    if (n < 0) sess_err(ss, "-", 500, "internal", "metrics too large");
    else sess_body(ss, ss->s->metrics_text, (size_t)n);
}

static void verb_quit(srv_sess *ss, const proto_line *l) {
    (void)l;
    sess_printf(ss, "OK bye\n");
    sess_close(ss);
}


/* DEBUG's answers to a session (net/srv_debug.c) */
static void dbg_line(void *ud, const char *text) { sess_printf(ud, "%s\n", text); }
static void dbg_body(void *ud, const char *text, size_t len) { sess_body(ud, text, len); }
static void dbg_err(void *ud, int code, const char *slug, const char *msg) { sess_err(ud, "-", code, slug, msg); }

static void verb_debug(srv_sess *ss, const proto_line *l) {
    char who[96];
    snprintf(who, sizeof who, "session %d (%s)", ss->num, ss->peer);
    srv_debug_io io = {dbg_line, dbg_body, dbg_err, NULL, ss};
    srv_debug(ss->s, l, who, &io);
}

static void verb_again(srv_sess *ss, const proto_line *l) {
    (void)l;
    sess_err(ss, "-", 400, "bad_request", "already greeted");
}

/* Every verb of a greeted session; a new verb is a new row. */
static const struct {
    const char *name;
    int admin; /* needs an admin token */
    void (*fn)(srv_sess *ss, const proto_line *l);
} verbs[] = {
    {"GEN", 0, verb_gen},           {"CANCEL", 0, verb_cancel},    {"HEALTH", 0, verb_health},
    {"STATS", 0, verb_stats},     {"METRICS", 0, verb_metrics},  {"QUIT", 0, verb_quit},
    {"HELLO", 0, verb_again},       {"DRAIN", 1, verb_drain},      {"LADDER", 1, verb_ladder},
    {"CONFIG", 1, verb_config},     {"RELOAD", 1, verb_reload},    {"RESTART", 1, verb_restart},
    {"FAULT", 1, verb_fault},       {"UPDATE", 1, verb_update},    {"REBOOT", 1, verb_reboot},
    {"DEBUG", 1, verb_debug},
};

static void dispatch(srv_sess *ss, const proto_line *l) {
    for (size_t i = 0; i < sizeof verbs / sizeof verbs[0]; i++) {
        if (strcmp(l->verb, verbs[i].name)) continue;
        if (verbs[i].admin && ss->role != ROLE_ADMIN)
            sess_err(ss, "-", 403, "forbidden", "an admin token is needed");
        else
            verbs[i].fn(ss, l);
        return;
    }
    char err[256];
    snprintf(err, sizeof err, "unknown verb %s", l->verb);
    sess_err(ss, "-", 400, "bad_request", err);
}

void verb_line(srv_sess *ss, char *line, size_t len) {
    if (len && line[len - 1] == '\r') len--;
    size_t i = 0;
    while (i < len && line[i] == ' ') i++;
    if (i == len) return; /* empty lines are allowed: keep-alives typed by hand */
    proto_line l;
    char err[256];
    if (proto_split(line, len, &l, err, sizeof err) < 0) {
        if (ss->state != SS_READY) {
            sess_err(ss, "-", 401, "unauthorized", "HELLO first");
            sess_close(ss);
        } else {
            sess_err(ss, "-", 400, "bad_request", err);
        }
        return;
    }
    if (ss->state != SS_READY) {
        if (!strcmp(l.verb, "HELLO")) verb_hello(ss, &l);
        else {
            /* an HTTP request on a connection that chose the line protocol by ALPN */
            int http = l.n_pos == 2 && !strncmp(l.pos[1].s, "HTTP/", 5);
            sess_err(ss, "-", 401, "unauthorized",
                     http ? "HELLO first: this connection speaks the kiln line protocol (ALPN kiln/1); "
                            "for HTTP and the OpenAI API offer ALPN http/1.1 or none"
                          : "HELLO first");
            sess_close(ss);
        }
        return;
    }
    dispatch(ss, &l);
}
