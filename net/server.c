/* server: the server's setup, its engine driver hooks (sched/drive.c runs the engine; here the
 * loop's before-sleep flush, draining, the ladder's metrics), health, stats, /metrics
 * text, the timeout sweep and the config verbs' keys. */
#include "net/srv_int.h"
#include <fcntl.h>
#include "core/cpu/isa.h"
#include <time.h>
#include <unistd.h>

/* Each line starts with the UTC time to the millisecond (RFC 3339), so the log of a box
 * can be read against a balancer's and a client's. */
void srv_log(const srv *s, int level, const char *fmt, ...) {
    if (level > s->cfg.log.level) return;
    static const char *const names[] = {"error", "warn", "info", "debug"};
    struct timespec ts;
    struct tm tm;
    char when[32] = "";
    clock_gettime(CLOCK_REALTIME, &ts);
    if (gmtime_r(&ts.tv_sec, &tm))
        snprintf(when + strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm), 8, ".%03dZ ",
                 (int)(ts.tv_nsec / 1000000));
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%skilnd: %s: ", when, names[level]);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* The loop's before-sleep hook: what the callbacks buffered leaves, one write per
 * session, before the loop waits again. */
void srv_flush_dirty(srv *s) {
    while (s->dirty) {
        srv_sess *ss = s->dirty;
        s->dirty = ss->next_dirty;
        ss->dirty = 0;
        ss->next_dirty = NULL;
        sess_flush(ss); /* may free ss */
    }
}

static void before_sleep(loop_t *l, void *ud) {
    (void)l;
    srv_flush_dirty(ud);
}

/* The loop's pass hook: every pass into the histogram, and the longest of this window
 * and the one before (so the gauge and the heartbeat show a recent stall, not the worst
 * since start). */
static void on_loop_pass(void *ud, int64_t busy_us) {
    srv *s = ud;
    met_observe(s->met, s->m_loop_pass, (double)busy_us * 1e-6);
    int64_t now = loop_now_ms();
    if (now - s->lag_window_ms >= SRV_LAG_WINDOW_MS) {
        s->lag_max_us[1] = s->lag_max_us[0];
        s->lag_max_us[0] = 0;
        s->lag_window_ms = now;
    }
    if (busy_us > s->lag_max_us[0]) s->lag_max_us[0] = busy_us;
}

double srv_loop_max_ms(const srv *s) {
    int64_t m = s->lag_max_us[0] > s->lag_max_us[1] ? s->lag_max_us[0] : s->lag_max_us[1];
    return (double)m / 1e3;
}

void srv_kick(srv *s) {
    if (s->drv.eng) drive_kick(&s->drv);
}

/* Nothing left to run: when draining is done, close every session, then stop. */
static void on_idle(void *ud, int pending) {
    srv *s = ud;
    if (pending || !s->stopping || s->goodbye_ms) return;
    s->goodbye_ms = loop_now_ms() + SRV_GOODBYE_MS;
    for (srv_sess *ss = s->sessions; ss; ss = ss->next) sess_close(ss);
    srv_flush_dirty(s);
}

static void on_drive_log(void *ud, int level, const char *msg) { srv_log(ud, level, "%s", msg); }

int srv_live(const srv *s) {
    return drive_step_age_ms(&s->drv) < s->cfg.engine.step_timeout_ms;
}

int srv_ready(const srv *s) { return !s->draining && s->drv.lad.level < LADDER_SHED; }

int srv_health(const srv *s, char *out, size_t cap) {
    eng_stats st;
    eng_get_stats(s->eng, &st);
    return snprintf(out, cap, "HEALTH live=%d ready=%d level=%d running=%d waiting=%d draining=%d",
                    srv_live(s), srv_ready(s), s->drv.lad.level, st.running, st.waiting, s->draining);
}

int srv_stats(const srv *s, char *out, size_t cap) {
    eng_stats st;
    eng_get_stats(s->eng, &st);
    int total = s->env.kv->cfg.n_blocks, used = total - kv_free_blocks(s->env.kv);
    return snprintf(out, cap, "STATS uptime_s=%lld requests_total=%lld running=%d waiting=%d "
                    "kv_blocks_used=%d kv_blocks_total=%d kv_blocks_cached=%d kv_usage=%.4f "
                    "prefix_hit_rate=%.4f prompt_tokens_total=%lld generation_tokens_total=%lld "
                    "preemptions_total=%lld connections=%d backend=%s",
                    (long long)((loop_now_ms() - s->t_start_ms) / 1000), (long long)s->requests_total,
                    st.running, st.waiting, used, total, kv_cached_blocks(s->env.kv),
                    total ? (double)used / total : 0.0,
                    st.prefix_queries ? (double)st.prefix_hits / (double)st.prefix_queries : 0.0,
                    (long long)st.prompt_tokens, (long long)st.generation_tokens,
                    (long long)st.preemptions, s->n_sessions, s->env.be->ops->name);
}

/* The ladder's rung 2 in the metrics: 8-bit blocks, their share of the blocks held (in
 * use or cached), and conversions so far; and the blocks sliding windows gave back. */
static void srv_set_kv8_metrics(srv *s) {
    const kv_pool *kv = s->env.kv;
    int held = kv->n_ids - kv->n_free, q8 = kv_q8_blocks(kv);
    met_set(s->met, s->m_kv8, q8);
    met_set(s->met, s->m_kv8_share, held > 0 ? (double)q8 / held : 0.0);
    met_inc(s->met, s->m_kv8_conv, (double)(kv->stats.q8_conversions - s->kv8_conv_seen));
    s->kv8_conv_seen = kv->stats.q8_conversions;
    met_inc(s->met, s->m_kv_swa, (double)(kv->stats.swa_freed - s->kv_swa_seen));
    s->kv_swa_seen = kv->stats.swa_freed;
}

/* CPU time by the clock (no file to read); RSS from /proc/self/statm, read at scrape
 * time only, and left as it was when /proc is not there. Read with open/read into the
 * stack, not stdio: fopen mallocs a FILE and its buffer on every scrape. */
static void srv_set_process_metrics(srv *s) {
    struct timespec ts;
    if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) == 0) {
        double cpu = (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
        met_inc(s->met, s->m_proc_cpu, cpu - met_value(s->met, s->m_proc_cpu));
    }
    int fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    char buf[128];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return;
    buf[n] = 0;
    unsigned long size, resident;
    if (sscanf(buf, "%lu %lu", &size, &resident) == 2)
        met_set(s->met, s->m_proc_rss, (double)resident * (double)sysconf(_SC_PAGESIZE));
}

/* The transport's counters (net_stats): lwIP's own statistics and what kiln counts
 * around lwIP, as kiln_net_* counters; none on host sockets (the kernel has them). One
 * series per net_counters field, in its order. */
static const struct {
    const char *name, *help, *labels;
} net_series[] = {
    {"kiln_net_tcp_segments_sent_total", "TCP segments sent by lwIP: data, pure ACKs, RSTs and retransmissions", NULL},
    {"kiln_net_tcp_segments_received_total", "TCP segments received by lwIP", NULL},
    {"kiln_net_tcp_retransmits_total", "TCP segments lwIP sent again (timeout or fast retransmit)", NULL},
    {"kiln_net_tcp_resets_sent_total", "TCP RSTs sent by lwIP", NULL},
    {"kiln_net_tcp_input_errors_total", "TCP segments lwIP dropped as bad (checksum, length) or refused", NULL},
    {"kiln_net_tcp_syn_received_total", "SYNs that reached a listener", NULL},
    {"kiln_net_tcp_syn_dropped_total", "SYNs not answered with a SYN-ACK, by reason", "reason=\"backlog\""},
    {"kiln_net_tcp_syn_dropped_total", "SYNs not answered with a SYN-ACK, by reason", "reason=\"no_pcb\""},
    {"kiln_net_tcp_syn_dropped_total", "SYNs not answered with a SYN-ACK, by reason", "reason=\"time_wait\""},
    {"kiln_net_tcp_syn_retransmitted_total", "SYNs received again for a handshake in progress", NULL},
    {"kiln_net_tcp_connections_refused_total", "Handshakes reset at accept: the connection limit", NULL},
    {"kiln_net_link_frames_received_total", "Frames from the device handed to lwIP", NULL},
    {"kiln_net_link_frames_sent_total", "Frames written to the device", NULL},
    {"kiln_net_link_drops_total", "Frames dropped at the device, by direction and reason", "direction=\"rx\",reason=\"no_pbuf\""},
    {"kiln_net_link_drops_total", "Frames dropped at the device, by direction and reason", "direction=\"rx\",reason=\"bad_frame\""},
    {"kiln_net_link_drops_total", "Frames dropped at the device, by direction and reason", "direction=\"tx\",reason=\"device\""},
    {"kiln_net_mem_errors_total", "lwIP heap and pool allocations that failed", NULL},
};
_Static_assert(sizeof net_series / sizeof net_series[0] == sizeof(net_counters) / sizeof(uint64_t),
               "one series per net_counters field");
_Static_assert(sizeof net_series / sizeof net_series[0] == sizeof ((srv *)0)->m_net / sizeof(int),
               "one handle per series");

/* At render: each counter advanced by what the transport counted since the last. */
static void srv_set_net_metrics(srv *s) {
    net_counters c;
    if (!s->m_net_on || net_stats(s->env.net, &c) < 0) return;
    const uint64_t *now = (const uint64_t *)&c, *seen = (const uint64_t *)&s->net_seen;
    for (size_t i = 0; i < sizeof net_series / sizeof net_series[0]; i++)
        if (now[i] > seen[i]) met_inc(s->met, s->m_net[i], (double)(now[i] - seen[i]));
    s->net_seen = c;
}

/* Gauges sampled now; engine counters advanced by what happened since the last render. */
int srv_render_metrics(srv *s) {
    eng_stats st;
    eng_get_stats(s->eng, &st);
    int total = s->env.kv->cfg.n_blocks, used = total - kv_free_blocks(s->env.kv);
    met_set(s->met, s->m_running, st.running);
    met_set(s->met, s->m_waiting, st.waiting);
    met_set(s->met, s->m_kv, total ? (double)used / total : 0.0);
    met_set(s->met, s->m_level, s->drv.lad.level);
    met_set(s->met, s->m_batch, s->drv.lad.batch);
    met_set(s->met, s->m_pressure, s->drv.lad.pressure);
    srv_set_kv8_metrics(s);
    met_set(s->met, s->m_conns, s->n_sessions);
    met_set(s->met, s->m_up, srv_live(s));
    met_set(s->met, s->m_loop_max, srv_loop_max_ms(s) / 1e3);
    int paused = 0;
    for (srv_sess *ss = s->sessions; ss; ss = ss->next)
        for (srv_req *r = ss->reqs; r; r = r->next) paused += r->paused;
    met_set(s->met, s->m_paused, paused);
    srv_set_process_metrics(s);
    met_inc(s->met, s->m_pq, (double)(st.prefix_queries - s->last.prefix_queries));
    met_inc(s->met, s->m_ph, (double)(st.prefix_hits - s->last.prefix_hits));
    met_inc(s->met, s->m_preempt, (double)(st.preemptions - s->last.preemptions));
    met_inc(s->met, s->m_ptok, (double)(st.prompt_tokens - s->last.prompt_tokens));
    met_inc(s->met, s->m_gtok, (double)(st.generation_tokens - s->last.generation_tokens));
    s->last = st;
    srv_set_net_metrics(s);
    return met_render(s->met, s->metrics_text, SRV_METRICS_CAP);
}

/* A step ran past step_timeout_ms (a hung device or driver): the engine cannot be
 * trusted to finish anything, so every request in flight gets `ERR id 503 restarting`
 * now, the connections close, and kilnd exits for its supervisor to restart it. */
static void srv_step_hung(srv *s) {
    srv_log(s, CFG_LOG_ERROR, "a step has run %lld ms (step_timeout_ms %d): restarting",
            (long long)drive_step_age_ms(&s->drv), s->cfg.engine.step_timeout_ms);
    s->hung = s->restart = s->draining = s->stopping = 1;
    drive_ladder_restart(&s->drv);
    for (srv_sess *ss = s->sessions; ss; ss = ss->next) {
        for (srv_req *r = ss->reqs; r; r = r->next) {
            gen_fail(r, 503, "restarting", "the engine stopped responding; retry");
            r->sess = NULL; /* the engine keeps the slot; nothing more goes out for it */
        }
        ss->reqs = NULL, ss->n_reqs = 0;
        sess_close(ss);
    }
    s->goodbye_ms = loop_now_ms() + SRV_GOODBYE_MS;
    srv_flush_dirty(s);
}

/* After each tick of the ladder (sched/drive.c): its pressure, and when it moved, each
 * transition logged and counted. */
static void on_ladder_tick(void *ud, int moved) {
    srv *s = ud;
    const ladder *lad = &s->drv.lad;
    met_set(s->met, s->m_pressure, lad->pressure);
    if (!moved) return;
    for (int f = 0; f < LADDER_LEVELS; f++)
        for (int t = 0; t < LADDER_LEVELS; t++) {
            if (f == t) continue;
            uint64_t n = lad->transitions[f][t], seen = (uint64_t)met_value(s->met, s->m_trans[f][t]);
            if (n <= seen) continue;
            met_inc(s->met, s->m_trans[f][t], (double)(n - seen));
            srv_log(s, CFG_LOG_WARN, "ladder: %d (%s) -> %d (%s): pressure %.3f, batch %d%s", f,
                    ladder_names[f], t, ladder_names[t], lad->pressure, lad->batch,
                    t == LADDER_COMPACT && !lad->cfg.has_kv8 ? ", no 8-bit KV here: passed through" : "");
        }
    met_set(s->met, s->m_level, lad->level);
    met_set(s->met, s->m_batch, lad->batch);
}

/* drain_timeout_ms has passed with requests still running: each ends with ERR 503
 * draining (its END suppressed), and the engine drops it. */
static void srv_drain_expire(srv *s) {
    s->drain_expired = 1;
    int n = 0;
    for (srv_sess *ss = s->sessions; ss; ss = ss->next)
        for (srv_req *r = ss->reqs, *next; r; r = next) {
            next = r->next; /* eng_cancel may finish (and recycle) r right here */
            gen_fail(r, 503, "draining", "drain_timeout_ms passed; retry elsewhere");
            eng_cancel(s->eng, r->eng_id);
            n++;
        }
    srv_log(s, CFG_LOG_WARN, "drain: %d ms passed, %d request(s) ended with 503",
            s->cfg.engine.drain_timeout_ms, n);
    srv_flush_dirty(s);
    srv_kick(s);
}

/* Handshake/HELLO deadlines, idle connections, lingering closes. */
static int64_t sweep(loop_t *l, int64_t id, void *ud) {
    (void)l, (void)id;
    srv *s = ud;
    int64_t now = loop_now_ms();
    if (!s->hung && drive_step_age_ms(&s->drv) > s->cfg.engine.step_timeout_ms)
        srv_step_hung(s);
    if (s->fault_kv_until && now >= s->fault_kv_until) { /* FAULT kv_fail: the window is over */
        s->fault_kv_until = 0;
        kv_fail_from(s->env.kv, 0);
        srv_log(s, CFG_LOG_WARN, "fault kv_fail over");
        srv_kick(s);
    }
    if (s->fault_mem_until && now >= s->fault_mem_until) { /* FAULT conn_mem_fail: over */
        s->fault_mem_until = 0;
        mm_heap_fail_from(&s->heap, 0);
        srv_log(s, CFG_LOG_WARN, "fault conn_mem_fail over");
    }
    if (s->draining && !s->hung && !s->drain_expired &&
        now - s->drain_since_ms >= s->cfg.engine.drain_timeout_ms)
        srv_drain_expire(s);
    update_sweep(s);
    srv_debug_sweep(s);
    for (srv_sess *ss = s->sessions, *next; ss; ss = next) {
        next = ss->next;
        if (ss->state == SS_CLOSING || ss->broken == 2) {
            if (now >= ss->deadline_ms) sess_kill(ss, ss->state != SS_CLOSING);
        } else if (ss->state != SS_READY) {
            if (now >= ss->deadline_ms) {
                srv_log(s, CFG_LOG_INFO, "session %d: handshake timeout", ss->num);
                sess_kill(ss, 1);
            }
        } else if (ss->goaway && !ss->n_reqs && !ss->close_when_flushed &&
                   now - ss->last_rx_ms >= SRV_GOAWAY_IDLE_MS) {
            sess_close(ss); /* told to go elsewhere (draining), and now idle */
        } else if (!ss->n_reqs && !ss->close_when_flushed &&
                   now - ss->last_rx_ms >= s->cfg.net.idle_timeout_ms) {
            /* an idle HTTP keep-alive connection just closes (RFC 9112 9.5) */
            if (ss->kind != SK_HTTP) sess_err(ss, "-", 408, "idle_timeout", NULL);
            sess_close(ss);
        }
    }
    for (struct srv_http *h = s->https, *next; h; h = next) {
        next = h->next;
        if (now >= h->deadline_ms || (!h->resp_buf && now >= h->head_deadline_ms)) srvh_done(h, 1);
    }
    srv_flush_dirty(s);
    if (s->goodbye_ms && (s->n_sessions == 0 || now >= s->goodbye_ms)) loop_stop(s->env.loop);
    return SRV_SWEEP_MS;
}

/* labels with the model's name appended, as vLLM labels its series (`model_name`), so a
 * dashboard written for a fleet of several models can tell them apart. The name is
 * escaped for the exposition format and clipped to fit the registry's label field. */
static const char *srv_mlabels(const srv *s, const char *labels, char *out, size_t cap) {
    size_t n = 0;
    if (labels && *labels) n = (size_t)snprintf(out, cap, "%s,", labels);
    n += (size_t)snprintf(out + n, cap - n, "model_name=\"");
    for (const char *p = s->env.model_name ? s->env.model_name : ""; *p && n + 4 < cap && n < 200; p++) {
        if (*p == '\\' || *p == '"') out[n++] = '\\', out[n++] = *p;
        else if (*p == '\n') out[n++] = '\\', out[n++] = 'n';
        else out[n++] = *p;
    }
    snprintf(out + n, cap - n, "\"");
    return out;
}

/* The process metrics every Prometheus client library exports (process_*, unprefixed and
 * unlabelled, so generic dashboards find them), and kiln_build_info. */
static int add_process_metrics(srv *s) {
    metrics *m = s->met;
    char lab[96];
    snprintf(lab, sizeof lab, "version=\"%.32s\"", s->env.version ? s->env.version : "unknown");
    int bi = met_add_gauge(m, "kiln_build_info", "1, labelled with kilnd's version", lab);
    /* which backend serves, and whether it is a fallback (auto found no usable GPU) */
    char blab[96];
    snprintf(blab, sizeof blab, "backend=\"%s\",simd=\"%s\",fallback=\"%d\"", s->env.be->ops->name,
             isa_name(isa_level()), s->env.backend_note && s->env.backend_note[0]);
    int bk = met_add_gauge(m, "kiln_backend_info", "1, labelled with the backend serving the model", blab);
    if (bk < 0) return -1;
    met_set(m, bk, 1);
    s->m_proc_start = met_add_gauge(m, "process_start_time_seconds", "Start time of the process since the Unix epoch", NULL);
    s->m_proc_cpu = met_add_counter(m, "process_cpu_seconds_total", "User and system CPU time spent", NULL);
    s->m_proc_rss = met_add_gauge(m, "process_resident_memory_bytes", "Resident memory size", NULL);
    if (bi < 0 || s->m_proc_start < 0 || s->m_proc_cpu < 0 || s->m_proc_rss < 0) return -1;
    met_set(m, bi, 1);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    met_set(m, s->m_proc_start, (double)ts.tv_sec);
    return 0;
}

/* The kiln_net_* series (net_series, before srv_render_metrics), lwIP transports only. */
static int add_net_metrics(srv *s) {
    net_counters c;
    char lab[320];
    if (!s->env.net || net_stats(s->env.net, &c) < 0) return 0; /* host sockets: none */
    for (size_t i = 0; i < sizeof net_series / sizeof net_series[0]; i++) {
        s->m_net[i] = met_add_counter(s->met, net_series[i].name, net_series[i].help,
                                      srv_mlabels(s, net_series[i].labels, lab, sizeof lab));
        if (s->m_net[i] < 0) return -1;
    }
    s->m_net_on = 1;
    return 0;
}

static int add_metrics(srv *s) {
    metrics *m = s->met;
    static const double lat[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
                                 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0};
    static const double itl[] = {0.001, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075,
                                 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0};
    /* a pass is normally tens of µs; the bound for an abused loop is 100 ms */
    static const double pass[] = {0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                  0.25, 0.5, 1.0, 2.5};
    int nl = (int)(sizeof lat / sizeof lat[0]), ni = (int)(sizeof itl / sizeof itl[0]);
    int np = (int)(sizeof pass / sizeof pass[0]);
    char ml[256], lab[256];
    const char *mn = srv_mlabels(s, NULL, ml, sizeof ml); /* model_name="..." alone */
    s->m_up = met_add_gauge(m, "kiln_up", "1 while the event loop and the engine make progress", mn);
    s->m_running = met_add_gauge(m, "kiln_num_requests_running", "Sequences running (prefill or decode)", mn);
    s->m_waiting = met_add_gauge(m, "kiln_num_requests_waiting", "Sequences waiting to be scheduled", mn);
    s->m_kv = met_add_gauge(m, "kiln_kv_cache_usage_perc", "Fraction of KV-cache blocks in use (1 = full)", mn);
    /* vLLM's cache_config_info: what the Inference Extension reads the pool's shape from */
    char cc[64];
    snprintf(cc, sizeof cc, "block_size=\"%d\",num_gpu_blocks=\"%d\"", s->env.kv->cfg.block_size,
             s->env.kv->cfg.n_blocks);
    int cci = met_add_gauge(m, "kiln_cache_config_info", "1, labelled with the KV cache's shape (num_gpu_blocks: blocks in the pool, on the GPU or not)",
                            srv_mlabels(s, cc, lab, sizeof lab));
    met_set(m, cci, 1);
    s->m_pq = met_add_counter(m, "kiln_prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache", mn);
    s->m_ph = met_add_counter(m, "kiln_prefix_cache_hits_total", "Prompt tokens found in the prefix cache", mn);
    s->m_preempt = met_add_counter(m, "kiln_num_preemptions_total", "Sequences preempted (blocks freed, recomputed later)", mn);
    s->m_ptok = met_add_counter(m, "kiln_prompt_tokens_total", "Prompt tokens accepted", mn);
    s->m_gtok = met_add_counter(m, "kiln_generation_tokens_total", "Tokens generated", mn);
    /* successes by vLLM's finished_reason; cancelled and errored samples apart, so a
     * success rate is success / (success + cancelled + errored) */
    s->m_reason[EF_STOP] = met_add_counter(m, "kiln_request_success_total", "Samples finished with an answer, by reason",
                                           srv_mlabels(s, "finished_reason=\"stop\"", lab, sizeof lab));
    s->m_reason[EF_LENGTH] = met_add_counter(m, "kiln_request_success_total", "Samples finished with an answer, by reason",
                                             srv_mlabels(s, "finished_reason=\"length\"", lab, sizeof lab));
    s->m_reason[EF_CANCELLED] = met_add_counter(m, "kiln_request_cancelled_total", "Samples cancelled (CANCEL, a disconnect, drain_timeout_ms)", mn);
    s->m_reason[EF_ERROR] = met_add_counter(m, "kiln_request_errored_total", "Samples ended by an engine error", mn);
    s->m_rejected = met_add_counter(m, "kiln_requests_rejected_total", "Requests refused with 503 (queue full or shedding)", mn);
    s->m_ttft = met_add_histogram(m, "kiln_time_to_first_token_seconds", "Arrival to first token", mn, lat, nl);
    s->m_itl = met_add_histogram(m, "kiln_inter_token_latency_seconds", "Time between consecutive tokens of a sample", mn, itl, ni);
    s->m_e2e = met_add_histogram(m, "kiln_e2e_request_latency_seconds", "Arrival to finish, per sample", mn, lat, nl);
    /* vLLM's phases of a request: waiting, then prefill (to its first token), then decode */
    s->m_queue = met_add_histogram(m, "kiln_request_queue_time_seconds", "Arrival to the first step it is in, per sample", mn, lat, nl);
    s->m_prefill = met_add_histogram(m, "kiln_request_prefill_time_seconds", "First step to first token, per sample", mn, lat, nl);
    s->m_decode = met_add_histogram(m, "kiln_request_decode_time_seconds", "First token to finish, per sample", mn, lat, nl);
    s->m_infer = met_add_histogram(m, "kiln_request_inference_time_seconds", "First step to finish, per sample", mn, lat, nl);
    s->m_level = met_add_gauge(m, "kiln_degrade_level", "Degrade ladder level (0 normal .. 4 restart)", mn);
    s->m_conns = met_add_gauge(m, "kiln_connections_open", "Protocol connections open", mn);
    s->m_batch = met_add_gauge(m, "kiln_effective_batch_size", "Max sequences per step now (the ladder halves it under pressure)", mn);
    s->m_pressure = met_add_gauge(m, "kiln_memory_pressure", "Pressure the degrade ladder acts on (KV pool use, 0..1)", mn);
    s->m_shed = met_add_counter(m, "kiln_requests_shed_total", "Requests refused by the ladder's shed rung (503 retry_after_ms)", mn);
    s->m_kv8 = met_add_gauge(m, "kiln_kv_cache_8bit_blocks", "KV blocks held in 8 bits (the ladder's compact rung)", mn);
    s->m_kv8_share = met_add_gauge(m, "kiln_kv_cache_8bit_share", "Share of the KV blocks held (in use or cached) that are 8-bit, 0..1", mn);
    s->m_kv8_conv = met_add_counter(m, "kiln_kv_cache_8bit_conversions_total", "KV blocks turned to 8 bits", mn);
    s->m_kv_swa = met_add_counter(m, "kiln_kv_cache_window_freed_total",
                                  "KV blocks whose sliding-window layers' part was given back once no "
                                  "window reached it (the whole block when every layer is windowed)", mn);
    s->m_loop_pass = met_add_histogram(m, "kiln_event_loop_pass_seconds",
                                       "Work of one event-loop pass (callbacks, timers; the wait excluded): "
                                       "every connection waits while it runs", mn, pass, np);
    s->m_paused = met_add_gauge(m, "kiln_num_requests_paused",
                                "Requests paused until their client reads (its output over max_output_bytes); "
                                "also counted as running or waiting", mn);
    s->m_loop_max = met_add_gauge(m, "kiln_event_loop_pass_max_seconds",
                                  "Longest event-loop pass in the last 10 to 20 seconds", mn);
    for (int f = 0; f < LADDER_LEVELS; f++)
        for (int t = 0; t < LADDER_LEVELS; t++) {
            char ft[48];
            snprintf(ft, sizeof ft, "from=\"%d\",to=\"%d\"", f, t);
            s->m_trans[f][t] = f == t ? 0 : met_add_counter(m, "kiln_degrade_transitions_total",
                                                            "Degrade ladder transitions",
                                                            srv_mlabels(s, ft, lab, sizeof lab));
            if (s->m_trans[f][t] < 0) return -1;
        }
    int hs[] = {s->m_up, s->m_running, s->m_waiting, s->m_kv, cci, s->m_pq, s->m_ph, s->m_preempt, s->m_ptok,
                s->m_gtok, s->m_reason[0], s->m_reason[1], s->m_reason[2], s->m_reason[3], s->m_rejected,
                s->m_ttft, s->m_itl, s->m_e2e, s->m_level, s->m_conns, s->m_batch, s->m_pressure,
                s->m_shed, s->m_kv8, s->m_kv8_share, s->m_kv8_conv, s->m_kv_swa, s->m_loop_pass, s->m_loop_max, s->m_paused, s->m_queue, s->m_prefill, s->m_decode, s->m_infer};
    for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++)
        if (hs[i] < 0) return -1;
    if (add_process_metrics(s) < 0) return -1;
    return add_net_metrics(s);
}

/* The connections' heap (srv.heap). Reserved address space, not memory: pages cost only
 * once a connection touches them, and freed big buffers go back to the kernel
 * (mm/heap.h), so the cap can be generous. It is the sum of
 *   - every connection's usual needs, SRV_CONN_MEM each, for max_connections plus the
 *     pending budget (closing ones linger a moment beyond max_connections): the session,
 *     mbedTLS's two record buffers (~16.7 KB each, a 32 KB block each) and handshake
 *     state, the first input and output buffers;
 *   - SRV_BIG_CONNS connections at their limits at once: output at its hard limit, a line
 *     or HTTP request at its limit, and an API answer's buffers at theirs (every size
 *     rounded up to the power of two the heap hands out);
 *   - the server's own scratch for one answer and SRV_MAX_HTTP metrics responses.
 * 256 x max_output_bytes up front would be 256 MB at the default 1 MB: instead, many
 * connections at their limits at once share what is left, and one that finds it full is
 * refused (a new connection), fails its request (500) or is closed as over its output
 * limit, as when malloc fails. */
#define SRV_CONN_MEM (128u << 10)
#define SRV_BIG_CONNS 8

static size_t pow2_up(size_t n) {
    size_t p = 4096;
    while (p < n) p *= 2;
    return p;
}

static size_t srv_heap_bytes(const kiln_config *c) {
    size_t max_out = (size_t)c->net.max_output_bytes;
    size_t out = pow2_up(4 * max_out + SRV_METRICS_CAP + 64); /* out_reserve's hard limit */
    size_t line = (size_t)c->net.max_line_bytes + 1;
    size_t http = (size_t)c->net.max_http_head_bytes + (size_t)c->net.max_http_body_bytes;
    size_t in = pow2_up((line > http ? line : http) + 64);
    size_t answer = pow2_up(3 * max_out + 64); /* api_max */
    size_t conns = (size_t)c->net.max_connections + (size_t)c->net.max_pending_connections;
    return conns * SRV_CONN_MEM + SRV_BIG_CONNS * (out + in + 4 * answer + 16384) + answer +
           (size_t)SRV_MAX_HTTP * pow2_up(SRV_METRICS_CAP + 1024);
}

srv *srv_new(const srv_env *env, char *err, size_t errlen) {
    srv *s = calloc(1, sizeof *s);
    if (!s) { snprintf(err, errlen, "out of memory"); return NULL; }
    s->env = *env;
    s->cfg = *env->cfg;
    if (upd_init(&s->up, env->update_slot) < 0) {
        snprintf(err, errlen, "--update-slot wants a|b:PATH, not %.64s", env->update_slot);
        free(s);
        return NULL;
    }
    s->t_start_ms = loop_now_ms();
    const kiln_config *c = &s->cfg;
    char e2[512];
    if (srv_load_tokens(s, err, errlen) < 0) goto fail;
    tls_config tc = {c->net.cert, c->net.key, c->net.client_ca, c->net.client_ca[0] != 0};
    if (!(s->tls = tls_server_new(&tc, e2, sizeof e2))) {
        snprintf(err, errlen, "TLS: %s", e2);
        goto fail;
    }
    if (mm_heap_init(&s->heap, srv_heap_bytes(c)) < 0) {
        snprintf(err, errlen, "cannot reserve %zu bytes for the connections", srv_heap_bytes(c));
        goto fail;
    }
    /* the sessions' TLS state from here on (this is the loop's thread) */
    tls_use_heap(&s->heap, c->net.max_connections + c->net.max_pending_connections);
    s->http_slots = calloc(SRV_MAX_HTTP, sizeof *s->http_slots);
    if (!s->http_slots) { snprintf(err, errlen, "out of memory"); goto fail; }
    for (int i = SRV_MAX_HTTP - 1; i >= 0; i--) s->http_slots[i].next = s->free_https, s->free_https = &s->http_slots[i];
    s->n_req_slots = c->engine.max_queued_requests;
    s->reqs = calloc((size_t)s->n_req_slots, sizeof *s->reqs);
    s->metrics_text = malloc(SRV_METRICS_CAP);
    s->met = met_new(96);
    int chat_kind = prompt_chat_kind(&env->m->gguf, c->model.chat_template);
    if (prompt_chat_warning(chat_kind)) srv_log(s, CFG_LOG_WARN, "%s", prompt_chat_warning(chat_kind));
    /* a GEN's system + prompt come in at most two lines, its conversation in one line plus
     * PROMPT_MSG_OVERHEAD per message; an OpenAI body's messages render to at most twice
     * the body (a template's markup per turn is at most twice the JSON around it:
     * PROMPT_MSG_OVERHEAD against "{\"role\":\"user\",\"content\":\"\"}") */
    size_t max_in = 2 * (size_t)c->net.max_line_bytes + (size_t)PROTO_MAX_MSGS * PROMPT_MSG_OVERHEAD;
    if (max_in < 2 * (size_t)c->net.max_http_body_bytes) max_in = 2 * (size_t)c->net.max_http_body_bytes;
    if (prompt_init(&s->pb, env->tok, chat_kind, max_in) < 0 || prompt_template(&s->pb, &env->m->gguf) < 0 || !s->reqs ||
        !s->metrics_text || !s->met || add_metrics(s) < 0 || api_init(s) < 0) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    for (int i = s->n_req_slots - 1; i >= 0; i--) s->reqs[i].next = s->free_reqs, s->free_reqs = &s->reqs[i];
    eng_config ec = {.max_batch_size = c->engine.max_batch_size,
                     .max_batched_tokens = c->engine.max_batched_tokens,
                     .max_seq_len = env->max_seq_len,
                     .max_seqs = env->kv->cfg.max_seqs,
                     .max_queued_requests = c->engine.max_queued_requests,
                     .max_queued_tokens = c->engine.max_queued_tokens,
                     .prefix_caching = c->engine.prefix_caching,
                     .fair_batch = c->engine.fair_batch,
                     .itl_target_ms = c->engine.itl_target_ms};
    eng_callbacks cb = {gen_on_token, gen_on_finish};
    if (!(s->eng = eng_new(&ec, env->m, env->tok, env->kv, env->be, &cb, err, errlen))) goto fail;
    drive_hooks dh = {.idle = on_idle, .log = on_drive_log, .ladder_tick = on_ladder_tick, .ud = s};
    if (drive_init(&s->drv, env->loop, s->eng, env->be, env->kv, &dh) < 0) {
        snprintf(err, errlen, "cannot watch the backend's event fd");
        goto fail;
    }
    loop_set_before_sleep(env->loop, before_sleep, s);
    s->lag_window_ms = loop_now_ms();
    loop_set_pass_hook(env->loop, on_loop_pass, s);
    if (net_listen(env->net, c->net.listen_host, c->net.listen_port, sess_accept, s, e2, sizeof e2) < 0) {
        snprintf(err, errlen, "listen %s:%d: %s", c->net.listen_host, c->net.listen_port, e2);
        goto fail;
    }
    if (c->net.metrics_port &&
        net_listen(env->net, c->net.listen_host, c->net.metrics_port, srvh_accept, s, e2, sizeof e2) < 0) {
        snprintf(err, errlen, "listen %s:%d (metrics): %s", c->net.listen_host, c->net.metrics_port, e2);
        goto fail;
    }
    s->sweep_timer = loop_timer_add(env->loop, SRV_SWEEP_MS, sweep, s);
    if (s->sweep_timer < 0) { snprintf(err, errlen, "no timer for the sweep"); goto fail; }
    /* The ladder: rung 2 acts where the pool can hold 8-bit blocks (the CPU backend's,
     * [engine] kv_8bit); elsewhere it passes through to shedding. */
    ladder_config lc = {c->engine.ladder_high, c->engine.ladder_low, c->engine.ladder_hold_ms,
                        c->engine.max_batch_size, env->kv->cfg.kv8};
    int lr = drive_ladder_start(&s->drv, &lc, c->engine.ladder_tick_ms);
    if (lr < 0) {
        snprintf(err, errlen, lr == -EINVAL ? "[engine] ladder_low must be below ladder_high"
                                            : "no timer for the ladder");
        goto fail;
    }
    return s;
fail:
    srv_free(s);
    return NULL;
}

void srv_free(srv *s) {
    if (!s) return;
    while (s->sessions) sess_kill(s->sessions, 1);
    if (upd_busy(&s->up)) upd_abort(&s->up);
    while (s->https) srvh_done(s->https, 1);
    if (s->sweep_timer > 0) loop_timer_del(s->env.loop, s->sweep_timer);
    if (s->drv.loop) loop_set_before_sleep(s->env.loop, NULL, NULL);
    if (s->drv.loop) loop_set_pass_hook(s->env.loop, NULL, NULL);
    drive_free(&s->drv);
    eng_free(s->eng);
    tls_server_free(s->tls);
    met_free(s->met);
    prompt_free(&s->pb);
    api_free(s);
    free(s->reqs), free(s->metrics_text);
    free(s->http_slots);
    /* everything a connection took is back by now (LSan cannot see into the heap): say
     * so when not, a leak on some path */
    if (s->heap.used)
        srv_log(s, CFG_LOG_WARN, "connection memory: %zu bytes not given back (a leak)", s->heap.used);
    if (s->heap.base) tls_use_heap(NULL, 0); /* before the heap goes */
    /* a block still held (by whatever leaked it) must stay valid: then the mapping stays
     * too, only address space, for the little while until the process ends */
    if (!s->heap.used) mm_heap_free_all(&s->heap);
    free(s);
}

/* "section.name" split for cfg_get / cfg_set; -EINVAL when malformed. */
static int split_key(const char *key, char sec[32], const char **name) {
    const char *dot = strchr(key, '.');
    if (!dot || dot == key || dot - key >= 32 || !dot[1]) return -EINVAL;
    memcpy(sec, key, (size_t)(dot - key));
    sec[dot - key] = 0;
    *name = dot + 1;
    return 0;
}

int srv_config_get(const srv *s, const char *key, char *out, size_t cap) {
    char sec[32];
    const char *name;
    if (split_key(key, sec, &name) < 0) return -EINVAL;
    return cfg_get(&s->cfg, sec, name, out, cap) < 0 ? -ENOENT : 0;
}

/* Keys a running server can take at once: request defaults and per-connection limits.
 * The rest shape memory carved at start (pools, batch sizes, the model) or sockets. */
static int config_live(const char *key) {
    static const char *const live_keys[] = {
        "sampling.", "engine.default_max_tokens", "net.idle_timeout_ms",
        "net.handshake_timeout_ms", "net.max_output_bytes", "net.max_requests_per_conn",
        "log.level", NULL};
    for (int i = 0; live_keys[i]; i++)
        if (!strncmp(key, live_keys[i], strlen(live_keys[i])) &&
            (live_keys[i][strlen(live_keys[i]) - 1] == '.' || !key[strlen(live_keys[i])]))
            return 1;
    return 0;
}

int srv_config_set(srv *s, const char *key, const char *value, char *err, size_t errlen) {
    char sec[32];
    const char *name;
    if (split_key(key, sec, &name) < 0) { snprintf(err, errlen, "want section.key"); return -EINVAL; }
    kiln_config c = s->cfg;
    if (cfg_set(&c, sec, name, value, err, errlen) < 0 || cfg_validate(&c, err, errlen) < 0) return -EINVAL;
    if (!config_live(key)) {
        snprintf(err, errlen, "%s takes effect at the next start of kilnd", key);
        return -EAGAIN;
    }
    s->cfg = c;
    srv_log(s, CFG_LOG_INFO, "config %s = %s", key, value);
    return 0;
}

void srv_set_draining(srv *s, int on) {
    if (on && !s->draining) s->drain_since_ms = loop_now_ms(), s->drain_expired = 0;
    s->draining = on != 0;
    srv_log(s, CFG_LOG_INFO, "drain %s", on ? "on" : "off");
    if (on) srv_goaway_all(s);
}

int srv_is_ready(const srv *s) { return srv_ready(s); }

int srv_reload(srv *s, char *err, size_t errlen) {
    int n = srv_load_tokens(s, err, errlen);
    if (n < 0) srv_log(s, CFG_LOG_WARN, "reload: %s", err);
    else srv_log(s, CFG_LOG_INFO, "reload: %d tokens from %s", n, s->cfg.net.tokens_file);
    return n;
}

/* GENs served: samples that ended by stop or length (kiln-init blesses a slot on it) */
long long srv_served(const srv *s) {
    return (long long)(met_value(s->met, s->m_reason[EF_STOP]) + met_value(s->met, s->m_reason[EF_LENGTH]));
}

double srv_uptime_s(const srv *s) { return (double)(loop_now_ms() - s->t_start_ms) / 1e3; }

const char *srv_model_name(const srv *s) { return s->env.model_name; }
const char *srv_backend_name(const srv *s) { return s->env.be->ops->name; }
const char *srv_backend_note(const srv *s) { return s->env.backend_note ? s->env.backend_note : ""; }

void srv_drain(srv *s, int restart) {
    if (!s->draining) s->drain_since_ms = loop_now_ms(), s->drain_expired = 0;
    s->draining = 1;
    s->restart |= restart;
    s->stopping = 1;
    srv_log(s, CFG_LOG_INFO, "draining%s", restart ? " for a restart" : "");
    srv_goaway_all(s);
    srv_kick(s);
}

int srv_exit_code(const srv *s) { return s->restart ? SRV_EXIT_RESTART : 0; }

int srv_hung(const srv *s) { return s->hung; }
