/* test_drive: the engine on the loop through sched/drive, on the real model and CPU
 * backend: requests run to completion with the greedy tokens eng_run_sync gives, the
 * hooks fire (before and after each step, idle when done), a dropped completion leaves
 * the step in flight and its age growing, a slowed one still completes, and the
 * ladder's pins reach the engine and the hook. */
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "core/backend.h"
#include "model_fixture.h"
#include "sched/drive.h"

#define N_REQ 3
#define N_GEN 6

typedef struct {
    loop_t *lp;
    int before, after, idle, idle_pending, ticks, moved;
    int stop_on_idle;
} hooks_seen;

/* Per request: [index, n_out, out[N_GEN], finished]. */
typedef int req_slot[3 + N_GEN];

static void on_token(void *ud, int64_t req, int sample, int32_t tok, const char *text, int len,
                     float lp) {
    (void)req, (void)sample, (void)text, (void)len, (void)lp;
    int *slot = ud;
    if (tok >= 0 && slot[1] < N_GEN) slot[2 + slot[1]++] = tok;
}

static void on_finish(void *ud, int64_t req, int sample, int reason, const eng_usage *u,
                      const char *msg) {
    (void)req, (void)sample, (void)reason, (void)u, (void)msg;
    int *slot = ud;
    slot[2 + N_GEN]++;
}


static void h_before(void *ud) { ((hooks_seen *)ud)->before++; }
static void h_after(void *ud) { ((hooks_seen *)ud)->after++; }
static void h_idle(void *ud, int pending) {
    hooks_seen *h = ud;
    h->idle++, h->idle_pending = pending;
    if (h->stop_on_idle) loop_stop(h->lp);
}
static void h_tick(void *ud, int moved) {
    hooks_seen *h = ud;
    h->ticks++, h->moved += moved;
}

static const char *prompts[N_REQ] = {"The capital of France is", "One, two, three,",
                                     "Water boils at"};

static int submit_all(engine *eng, const tok_t *tok, req_slot *slots) {
    char err[256];
    for (int i = 0; i < N_REQ; i++) {
        int32_t ids[64];
        int n = tok_encode(tok, prompts[i], strlen(prompts[i]), 0, ids, 64);
        memset(slots[i], 0, sizeof slots[i]);
        slots[i][0] = i;
        eng_params p = {.prompt = ids, .n_prompt = n, .n = 1, .ud = slots[i]};
        sampler_params_default(&p.sp);
        p.sp.temperature = 0.0f, p.sp.max_tokens = N_GEN, p.ignore_eog = 1;
        if (eng_submit(eng, &p, err, sizeof err) < 0) {
            fprintf(stderr, "submit: %s\n", err);
            return -1;
        }
    }
    return 0;
}

typedef struct {
    kv_pool kv;
    backend *be;
    engine *eng;
} rig;

static int rig_open(rig *g, const model *m, const tok_t *tok) {
    char err[256];
    memset(g, 0, sizeof *g);
    kv_config kc = {0};
    model_kv_shape(m, &kc);
    kc.block_size = 16, kc.n_blocks = 64, kc.max_seqs = 8, kc.max_blocks_per_seq = 8;
    if (kv_pool_init(&g->kv, &kc, NULL) < 0) return -1;
    backend_cpu_config bc = {2, 64, 8, 128, 0};
    if (!(g->be = backend_cpu_new(m, &g->kv, &bc, err, sizeof err))) {
        fprintf(stderr, "backend: %s\n", err);
        return -1;
    }
    eng_config ec = {.max_batch_size = 8, .max_batched_tokens = 64, .max_seq_len = 128,
                     .max_seqs = 8, .max_queued_requests = 16};
    eng_callbacks cb = {on_token, on_finish};
    g->eng = eng_new(&ec, m, tok, &g->kv, g->be, &cb, err, sizeof err);
    if (!g->eng) fprintf(stderr, "eng_new: %s\n", err);
    return g->eng ? 0 : -1;
}

static void rig_close(rig *g) {
    eng_free(g->eng);
    if (g->be) g->be->ops->destroy(g->be);
    kv_pool_free(&g->kv);
}

/* A backend's own memory pressure (a GPU's device memory), set by the test. */
static double g_mem_pressure;
static double fake_mem_pressure(backend *be) {
    (void)be;
    return g_mem_pressure;
}

/* Run the loop until the hooks stop it, at most max_iter iterations of 50 ms. */
static void run_for(loop_t *lp, hooks_seen *h, int max_iter) {
    h->stop_on_idle = 1;
    for (int i = 0; i < max_iter; i++)
        if (loop_run_once(lp, 50) < 0 || h->idle) break;
}

int main(void) {
    model m;
    tok_t tok;
    if (fixture_load(&m, &tok, "test_drive") < 0) return 1;
    rig g;
    req_slot want[N_REQ], got[N_REQ];

    /* the reference: the same requests through eng_run_sync */
    CHECK(rig_open(&g, &m, &tok) == 0, "rig");
    CHECK(submit_all(g.eng, &tok, want) == 0, "submit");
    CHECK(eng_run_sync(g.eng) == 0, "run_sync");
    rig_close(&g);

    /* the same through the driver on a loop */
    CHECK(rig_open(&g, &m, &tok) == 0, "rig");
    loop_t *lp = loop_new(1024, 16);
    hooks_seen h = {.lp = lp};
    drive d;
    drive_hooks dh = {h_before, h_after, h_idle, NULL, h_tick, &h};
    CHECK(drive_init(&d, lp, g.eng, g.be, &g.kv, &dh) == 0, "drive_init");
    CHECK(drive_step_age_ms(&d) == 0, "no step: age 0");
    CHECK(submit_all(g.eng, &tok, got) == 0, "submit");
    drive_kick(&d);
    CHECK(eng_busy(g.eng), "kick started a step");
    run_for(lp, &h, 400);
    eng_stats st;
    eng_get_stats(g.eng, &st);
    for (int i = 0; i < N_REQ; i++) {
        CHECK(got[i][2 + N_GEN] == 1, "request %d finished once (%d)", i, got[i][2 + N_GEN]);
        CHECK(got[i][1] == N_GEN && !memcmp(got[i] + 2, want[i] + 2, N_GEN * sizeof(int)),
              "request %d: the driver's greedy tokens are eng_run_sync's", i);
    }
    CHECK(h.idle == 1 && h.idle_pending == 0, "idle once, nothing pending (%d, %d)", h.idle, h.idle_pending);
    CHECK(h.after == st.steps && h.after > 0, "after_step once per step (%d, %lld)", h.after, (long long)st.steps);
    CHECK(h.before == h.after + 1, "before_step before each step and the idle check (%d)", h.before);

    /* a dropped completion: the step stays in flight, its age grows, nothing finishes */
    h = (hooks_seen){.lp = lp};
    drive_fault_drop(&d);
    CHECK(submit_all(g.eng, &tok, got) == 0, "submit");
    drive_kick(&d);
    /* (the backend's event fd stays readable while its step is not taken: no waiting in
     * the loop here) */
    for (int i = 0; i < 6; i++) loop_run_once(lp, 20);
    usleep(70 * 1000);
    CHECK(eng_busy(g.eng) && h.after == 0, "dropped: still busy, no results (%d)", h.after);
    CHECK(drive_step_age_ms(&d) >= 60, "dropped: the step's age grows (%lld ms)", (long long)drive_step_age_ms(&d));
    for (int i = 0; i < N_REQ; i++) CHECK(got[i][2 + N_GEN] == 0, "dropped: request %d not finished", i);
    drive_free(&d);
    loop_free(lp);
    rig_close(&g);

    /* slowed completions still complete; the ladder's pins reach the engine */
    CHECK(rig_open(&g, &m, &tok) == 0, "rig");
    lp = loop_new(1024, 16);
    h = (hooks_seen){.lp = lp};
    CHECK(drive_init(&d, lp, g.eng, g.be, &g.kv, &dh) == 0, "drive_init");
    ladder_config lc = {0.9, 0.8, 1000, 8, 0};
    CHECK(drive_ladder_start(&d, &lc, 10) == 0, "ladder start");
    drive_fault_slow(&d, 30, 2);
    CHECK(submit_all(g.eng, &tok, got) == 0, "submit");
    drive_kick(&d);
    run_for(lp, &h, 400);
    for (int i = 0; i < N_REQ; i++)
        CHECK(got[i][2 + N_GEN] == 1 && !memcmp(got[i] + 2, want[i] + 2, N_GEN * sizeof(int)),
              "slowed: request %d finished with the same tokens", i);
    CHECK(h.ticks > 0 && h.moved == 0, "ladder ticked without moving at low pressure (%d, %d)", h.ticks, h.moved);
    CHECK(drive_pressure(&d) == 0.0, "all blocks back: pressure 0 (%.3f)", drive_pressure(&d));
    CHECK(drive_ladder_pin(&d, 1) == 1 && d.lad.level == 1 && h.moved == 1,
          "pin 1: level 1, the hook told (%d %d)", d.lad.level, h.moved);
    CHECK(eng_set_max_batch(g.eng, 8) == 8 && drive_ladder_pin(&d, 3) == 1 && d.lad.level == 3,
          "pin 3: shed (%d)", d.lad.level);
    CHECK(drive_retry_after_ms(&d) >= DRIVE_SHED_MIN_MS && drive_retry_after_ms(&d) <= DRIVE_SHED_MAX_MS,
          "retry_after in bounds (%d)", drive_retry_after_ms(&d));
    CHECK(drive_ladder_pin(&d, 7) < 0, "pin 7 refused");
    drive_ladder_restart(&d);
    CHECK(d.lad.level == LADDER_RESTART && drive_ladder_pin(&d, 0) < 0, "restart: level 4, no pin after");
    drive_free(&d);
    loop_free(lp);
    rig_close(&g);

    /* the backend's memory pressure counts when it is the larger: the ladder climbs on it
     * with the KV pool empty, and comes back down when it goes */
    CHECK(rig_open(&g, &m, &tok) == 0, "rig");
    lp = loop_new(1024, 16);
    h = (hooks_seen){.lp = lp};
    static backend_ops ops_mp;
    const backend_ops *ops0 = g.be->ops;
    ops_mp = *ops0, ops_mp.mem_pressure = fake_mem_pressure;
    g.be->ops = &ops_mp;
    CHECK(drive_init(&d, lp, g.eng, g.be, &g.kv, &dh) == 0, "drive_init");
    ladder_config lm = {0.9, 0.8, 30, 8, 0};
    CHECK(drive_ladder_start(&d, &lm, 5) == 0, "ladder start");
    g_mem_pressure = 0.95;
    CHECK(drive_pressure(&d) == 0.95, "pressure: the backend's 0.95 (%.3f)", drive_pressure(&d));
    /* bounded in time, not in loop turns: a loaded CI machine may wake the loop early */
    int64_t until = loop_now_ms() + 5000;
    while (d.lad.level < LADDER_SHED && loop_now_ms() < until) loop_run_once(lp, 10);
    CHECK(d.lad.level == LADDER_SHED && h.moved > 0, "device memory short: the ladder sheds (level %d)",
          d.lad.level);
    g_mem_pressure = 0.1;
    CHECK(drive_pressure(&d) == 0.1, "pressure follows it down (%.3f)", drive_pressure(&d));
    until = loop_now_ms() + 5000;
    while (d.lad.level > LADDER_NORMAL && loop_now_ms() < until) loop_run_once(lp, 10);
    CHECK(d.lad.level == LADDER_NORMAL, "memory back: level %d", d.lad.level);
    g.be->ops = ops0;
    drive_free(&d);
    loop_free(lp);
    rig_close(&g);

    tok_free(&tok);
    model_free(&m);
    return check_done("test_drive");
}
