/* srv_gen: the one way a request reaches the engine (gen_submit, for GEN and the OpenAI API
 * alike), GEN and CANCEL: a request from a line, its tokens streamed back as TOK lines, END
 * with its usage, through the engine's callbacks (an API request's go to net/srv_api.c). */
#include "net/srv_int.h"

void gen_on_token(void *ud, int64_t id, int sample, int32_t tok, const char *text, int len,
                  float lp) {
    (void)id;
    srv_req *r = ud;
    srv *s = r->owner;
    double t = now_s();
    if (tok >= 0 && r->t_last[sample] > 0) met_observe(s->met, s->m_itl, t - r->t_last[sample]);
    if (tok >= 0) r->t_last[sample] = t;
    srv_sess *ss = r->sess;
    if (ss && r->api) { api_on_token(r, sample, tok, text, len, lp); return; }
    if (!ss) return; /* nobody to show it to */
    /* held-back text (len 0) sends nothing, except that with logprobs every sampled token
     * has its own line: its logprob must not be lost with the text it waits for */
    if (len <= 0 && !(r->logprobs && tok >= 0)) return;
    sess_printf(ss, "TOK %s ", r->id);
    sess_quote(ss, text, len > 0 ? (size_t)len : 0);
    if (r->n > 1) sess_printf(ss, " sample=%d", sample);
    if (r->logprobs && tok >= 0) sess_printf(ss, " token=%d logprob=%.6g", tok, lp);
    sess_printf(ss, "\n");
}

static void req_unlink(srv_sess *ss, srv_req *r) {
    for (srv_req **p = &ss->reqs; *p; p = &(*p)->next)
        if (*p == r) {
            *p = r->next;
            ss->n_reqs--;
            return;
        }
}

void gen_on_finish(void *ud, int64_t id, int sample, int reason, const eng_usage *u,
                   const char *msg) {
    (void)id;
    srv_req *r = ud;
    srv_sess *ss = r->sess;
    srv *s = r->owner;
    static const char *const reasons[] = {"stop", "length", "cancelled", "error"};
    met_inc(s->met, s->m_reason[reason], 1);
    met_observe(s->met, s->m_e2e, u->e2e_s);
    met_observe(s->met, s->m_queue, u->queue_s);
    if (u->completion_tokens > 0) {
        met_observe(s->met, s->m_ttft, u->ttft_s);
        met_observe(s->met, s->m_prefill, u->ttft_s - u->queue_s);
        met_observe(s->met, s->m_decode, u->e2e_s - u->ttft_s);
        met_observe(s->met, s->m_infer, u->e2e_s - u->queue_s);
    }
    if (ss && r->api) {
        if (reason == EF_ERROR) gen_fail(r, 500, "internal", msg);
        else if (!r->failed) api_on_finish(r, sample, reason, u, msg);
    } else if (ss) {
        if (reason == EF_ERROR) {
            if (!r->failed++) sess_err(ss, r->id, 500, "internal", msg);
        } else if (!r->failed) {
            double tpot = u->completion_tokens > 1
                              ? (u->e2e_s - u->ttft_s) / (u->completion_tokens - 1) : 0.0;
            sess_printf(ss, "END %s reason=%s prompt_tokens=%d completion_tokens=%d cached_tokens=%d "
                        "ttft_ms=%.1f tpot_ms=%.2f e2e_ms=%.1f",
                        r->id, reasons[reason], u->prompt_tokens, u->completion_tokens,
                        u->cached_tokens, u->ttft_s * 1e3, tpot * 1e3, u->e2e_s * 1e3);
            if (r->n > 1) sess_printf(ss, " sample=%d", sample);
            sess_printf(ss, "\n");
        }
    }
    if (++r->n_done < r->n) return;
    /* the access log: one line per request, at its last sample */
    srv_log(s, CFG_LOG_INFO, "access: peer=%s session=%d id=%s door=%s n=%d reason=%s prompt_tokens=%d "
            "completion_tokens=%d ttft_ms=%.1f e2e_ms=%.1f", ss ? ss->peer : "gone", ss ? ss->num : 0, r->id,
            r->api ? "http" : "line", r->n, reasons[reason], u->prompt_tokens, u->completion_tokens,
            u->ttft_s * 1e3, u->e2e_s * 1e3);
    drive_note_finished(&s->drv);
    if (ss) req_unlink(ss, r);
    if (r->api) api_req_free(r); /* after the unlink: the session may take its next request */
    r->sess = NULL;
    r->next = s->free_reqs;
    s->free_reqs = r;
}

static srv_req *gen_find_req(srv_sess *ss, const char *id) {
    for (srv_req *r = ss->reqs; r; r = r->next)
        if (!strcmp(r->id, id)) return r;
    return NULL;
}

/* A refusal for gen_submit's caller; 503s are counted as rejected. */
static int gen_refuse(gen_err *e, int code, const char *slug, int retry_ms, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int gen_refuse(gen_err *e, int code, const char *slug, int retry_ms, const char *fmt, ...) {
    e->code = code, e->slug = slug, e->retry_ms = retry_ms;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return -1;
}

/* g's sampling keys over the config's defaults. */
static void gen_sampling(const srv *s, const proto_gen *g, int max_tokens, sampler_params *sp) {
    const kiln_config *c = &s->cfg;
    sampler_params_default(sp);
    sp->temperature = g->set & PG_TEMPERATURE ? g->temperature : (float)c->sampling.temperature;
    sp->top_p = g->set & PG_TOP_P ? g->top_p : (float)c->sampling.top_p;
    sp->top_k = g->set & PG_TOP_K ? g->top_k : c->sampling.top_k;
    sp->min_p = g->set & PG_MIN_P ? g->min_p : (float)c->sampling.min_p;
    sp->repeat_penalty = g->set & PG_REPEAT_PENALTY ? g->repeat_penalty : (float)c->sampling.repeat_penalty;
    sp->repeat_last_n = g->repeat_last_n;
    sp->presence_penalty = g->presence_penalty;
    sp->frequency_penalty = g->frequency_penalty;
    sp->seed = g->set & PG_SEED ? g->seed : c->sampling.seed;
    sp->max_tokens = max_tokens;
}

int gen_submit(srv_sess *ss, const proto_gen *g, const chat_msg *msgs, int n_msgs, srv_req **rp,
               int *n_prompt_out, gen_err *e) {
    srv *s = ss->s;
    char err[256];
    *rp = NULL;
    if (s->draining) return gen_refuse(e, 503, "draining", 0, "the server is draining");
    if (s->drv.lad.level >= LADDER_SHED) { /* the ladder's third rung: running ones finish */
        met_inc(s->met, s->m_rejected, 1);
        met_inc(s->met, s->m_shed, 1);
        return gen_refuse(e, 503, "overloaded", drive_retry_after_ms(&s->drv), "the server is shedding load");
    }
    if (ss->n_reqs >= s->cfg.net.max_requests_per_conn)
        return gen_refuse(e, 429, "too_many", 0, "too many requests in flight on this connection");
    if (s->cfg.net.max_requests_per_token > 0 && ss->tok >= 0 &&
        srv_token_requests(s, ss->tok) >= s->cfg.net.max_requests_per_token)
        return gen_refuse(e, 429, "too_many", 0, "too many requests in flight for this token");
    if (g->n > SRV_MAX_N) return gen_refuse(e, 400, "bad_request", 0, "n is too large");
    prompt_req pr = {.system = g->system, .user = g->prompt, .user_len = g->prompt_len,
                     .chat = g->chat, .msgs = msgs, .n_msgs = n_msgs};
    int n_prompt = prompt_build(&s->pb, &pr);
    if (n_prompt < 0) return gen_refuse(e, 400, "bad_request", 0, "%s", prompt_strerror(n_prompt));
    if (n_prompt == 0) return gen_refuse(e, 400, "bad_request", 0, "the prompt is empty");
    *n_prompt_out = n_prompt;
    int max_tokens = g->set & PG_MAX_TOKENS ? g->max_tokens : s->cfg.engine.default_max_tokens;
    if (n_prompt + max_tokens > s->env.max_seq_len)
        return gen_refuse(e, 413, "too_long", 0, "prompt (%d tokens) + max_tokens (%d) exceeds the context (%d)",
                          n_prompt, max_tokens, s->env.max_seq_len);
    srv_req *r = s->free_reqs;
    if (!r) {
        met_inc(s->met, s->m_rejected, 1);
        return gen_refuse(e, 503, "overloaded", SRV_RETRY_MS, "the request queue is full");
    }
    if (max_tokens == 0) return 0; /* nothing to generate: the usage alone */
    eng_params ep = {0};
    ep.prompt = s->pb.ids, ep.n_prompt = n_prompt, ep.n = g->n, ep.ud = r;
    ep.stops = g->stops, ep.n_stops = g->n_stops;
    ep.ignore_eog = g->ignore_eos, ep.logprobs = g->logprobs, ep.top_logprobs = g->top_logprobs;
    ep.client = ss->num + 1; /* fairness across connections (0 would mean "anyone") */
    gen_sampling(s, g, max_tokens, &ep.sp);
    int64_t eid = eng_submit(s->eng, &ep, err, sizeof err);
    if (eid < 0) {
        if (eid == -EAGAIN) {
            met_inc(s->met, s->m_rejected, 1);
            return gen_refuse(e, 503, "overloaded", SRV_RETRY_MS, "the engine's queue is full");
        }
        return gen_refuse(e, eid == -E2BIG ? 413 : 400, eid == -E2BIG ? "too_long" : "bad_request", 0, "%s", err);
    }
    s->free_reqs = r->next;
    memset(r, 0, sizeof *r);
    r->owner = s, r->sess = ss, r->eng_id = eid, r->n = g->n, r->logprobs = g->logprobs;
    snprintf(r->id, sizeof r->id, "%s", g->id ? g->id : "-");
    r->next = ss->reqs;
    ss->reqs = r;
    ss->n_reqs++;
    s->requests_total++;
    if (ss->paused) eng_pause(s->eng, eid, 1), r->paused = 1;
    srv_kick(s);
    *rp = r;
    return 1;
}

void gen_fail(srv_req *r, int code, const char *slug, const char *msg) {
    if (r->failed++ || !r->sess) return;
    if (r->api) api_fail(r, code, slug, msg);
    else sess_err(r->sess, r->id, code, slug, msg);
}

void verb_gen(srv_sess *ss, const proto_line *l) {
    proto_gen g;
    char err[256];
    if (proto_gen_parse(l, &g, err, sizeof err) < 0) {
        const proto_str *id = proto_get(l, "id");
        sess_err(ss, id && proto_id_ok(id->s, id->len) ? id->s : "-", 400, "bad_request", err);
        return;
    }
    /* checked where GEN always did: after draining and shedding, before the rest */
    if (!ss->s->draining && ss->s->drv.lad.level < LADDER_SHED && gen_find_req(ss, g.id)) {
        sess_err(ss, g.id, 409, "duplicate_id", "that id is in flight");
        return;
    }
    /* the conversation form goes through the template as the OpenAI API's messages do */
    chat_msg msgs[PROTO_MAX_MSGS];
    for (int i = 0; i < g.n_msgs; i++) msgs[i] = (chat_msg){g.msgs[i].role, g.msgs[i].content};
    srv_req *r;
    int n_prompt = 0;
    gen_err e;
    int rc = gen_submit(ss, &g, g.n_msgs ? msgs : NULL, g.n_msgs, &r, &n_prompt, &e);
    if (rc == 0)
        sess_printf(ss, "END %s reason=length prompt_tokens=%d completion_tokens=0 cached_tokens=0 "
                    "ttft_ms=0 tpot_ms=0 e2e_ms=0\n", g.id, n_prompt);
    else if (rc < 0 && e.retry_ms > 0)
        sess_printf(ss, "ERR %s %d %s retry_after_ms=%d\n", g.id, e.code, e.slug, e.retry_ms);
    else if (rc < 0)
        sess_err(ss, g.id, e.code, e.slug, e.msg);
}

void verb_cancel(srv_sess *ss, const proto_line *l) {
    const proto_str *id = l->n_pos == 1 && l->n_kv == 0 ? &l->pos[0] : proto_get(l, "id");
    if (!id || !proto_id_ok(id->s, id->len) || l->n_pos + l->n_kv != 1) {
        sess_err(ss, "-", 400, "bad_request", "usage: CANCEL <id>");
        return;
    }
    srv_req *r = gen_find_req(ss, id->s);
    if (!r) { sess_err(ss, id->s, 404, "not_found", "no such request in flight"); return; }
    eng_cancel(ss->s->eng, r->eng_id); /* END reason=cancelled comes from gen_on_finish */
    srv_kick(ss->s);
}
