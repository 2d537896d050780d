/* srv_fault: fault injection for tests (kilnd serve --faults only): FAULT drop_step,
 * slow_step, kv_fail, write_fail, conn_mem_fail. */
#include "net/srv_int.h"

/* FAULT <what> [ms=N] [count=K] (admin, kilnd serve --faults only): slow_step delays the
 * next K step completions by N ms (a slow device); kv_fail makes every KV block
 * allocation fail for N ms (the engine preempts and waits, loses nothing); write_fail
 * makes the next K writes of sessions with requests in flight fail (a peer that
 * vanished: the session is reset, its requests cancelled and their blocks freed);
 * conn_mem_fail makes the connections' heap refuse every allocation for N ms, as when it
 * is full (new connections are refused, a request that needs memory fails, the rest go
 * on), or with count=K only its K-th allocation from now (wherever that falls: the
 * session, TLS setup, the handshake, a buffer). -1
 * for an unknown fault or bad numbers. */
static int fault_arm(srv *s, const char *what, const proto_line *l) {
    const proto_str *ms = proto_get(l, "ms"), *count = proto_get(l, "count");
    long v_ms = ms ? strtol(ms->s, NULL, 10) : 0, v_n = count ? strtol(count->s, NULL, 10) : 1;
    if (v_ms < 0 || v_ms > 600000 || v_n < 1 || v_n > 1000000) return -1;
    if (!strcmp(what, "slow_step") && ms) {
        drive_fault_slow(&s->drv, (int)v_ms, (int)v_n);
    } else if (!strcmp(what, "kv_fail") && ms) {
        s->fault_kv_until = loop_now_ms() + v_ms;
        kv_fail_from(s->env.kv, 1);
    } else if (!strcmp(what, "write_fail")) {
        s->fault_write_n = (int)v_n;
    } else if (!strcmp(what, "conn_mem_fail") && ms) {
        s->fault_mem_until = loop_now_ms() + v_ms;
        mm_heap_fail_from(&s->heap, 1);
    } else if (!strcmp(what, "conn_mem_fail") && count) {
        mm_heap_fail_after(&s->heap, (int)v_n); /* the K-th only: an OOM loop's step */
    } else {
        return -1;
    }
    return 0;
}

void verb_fault(srv_sess *ss, const proto_line *l) {
    srv *s = ss->s;
    if (!s->env.faults) {
        sess_err(ss, "-", 403, "forbidden", "fault injection is off (kilnd serve --faults)");
    } else if (l->n_pos == 1 && !strcmp(l->pos[0].s, "drop_step")) {
        drive_fault_drop(&s->drv);
        srv_log(s, CFG_LOG_WARN, "fault drop_step armed by session %d", ss->num);
        sess_printf(ss, "OK fault=drop_step\n");
    } else if (l->n_pos == 1 && fault_arm(s, l->pos[0].s, l) == 0) {
        srv_log(s, CFG_LOG_WARN, "fault %s armed by session %d", l->pos[0].s, ss->num);
        sess_printf(ss, "OK fault=%s\n", l->pos[0].s);
    } else {
        sess_err(ss, "-", 400, "bad_request",
                 "usage: FAULT drop_step | slow_step ms=N count=K | kv_fail ms=N | write_fail count=K | "
                 "conn_mem_fail ms=N|count=K");
    }
}
