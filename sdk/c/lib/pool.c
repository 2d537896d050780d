/* libkiln's kiln_client: connections_per_host connections (kl_one each) to every box of
 * the list, and which one a new request goes to.
 *
 * Routing: the usable connection (up, no GOAWAY) with the fewest requests in flight;
 * ties are taken in turn, starting past the last one chosen. Connection k has box
 * k % boxes as its home, so with two boxes and two per host the order is a0 b0 a1 b1.
 * A connection that is down and owes nothing is dialled again at its home box when a
 * request is routed and its backoff is over (1 s doubling to 30 s; back to 1 s once a
 * connection stayed up 30 s). With nothing usable, the request goes to the next
 * connection in turn, which reconnects by itself with failover over the list (what a
 * one-connection client always did). A connection that so ended up on another box
 * goes back home, when idle, once its home box takes connections again (probed on
 * the same backoff): otherwise a box that was down when the client started, or
 * restarted, would never get its share again. With one connection in all every call is the
 * kl_one's own; kiln_raw_open's client is such a pool, its one connection raw. */
#include <poll.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define KL_MAX_CONNS 64 /* handles carry the connection in their low 6 bits */
#define KL_CONN_BITS 6
#define KL_RECONNECT_MIN_MS 1000
#define KL_RECONNECT_MAX_MS 30000
#define KL_POLL_SLICE_MS 50 /* longest poll before retries and io timeouts are looked at */

typedef struct {
    kl_one *one;
    int was_up;        /* up when last looked at: a change starts the backoff */
    int64_t since_ms;  /* when it came up */
    int64_t retry_at_ms; /* down: not dialled before this */
    int delay_ms;      /* the backoff after its next failure */
} kl_slot;

struct kiln_client {
    kl_slot *slots;
    int n;    /* boxes x connections_per_host */
    int next; /* where the turn for ties starts */
    int last; /* the slot the last request went to (the accessors read it) */
};

/* ------------------------------------------------------------------ backoff */

static void backoff(kl_slot *s, int64_t now) {
    s->retry_at_ms = now + s->delay_ms;
    s->delay_ms = s->delay_ms * 2 > KL_RECONNECT_MAX_MS ? KL_RECONNECT_MAX_MS : s->delay_ms * 2;
}

static void came_up(kl_slot *s, int64_t now) {
    s->was_up = 1;
    s->since_ms = now;
}

/* Notice the connections that went down since the last look (their backoff starts),
 * close idle draining ones, and dial those whose backoff is over. A connection that
 * owes answers or retries, or is broken, is left to its own calls: tearing it down
 * here could run callbacks from inside another request's callback. */
static void revive(kiln_client *c) {
    int64_t now = kl_now_ms();
    for (int k = 0; k < c->n; k++) {
        kl_slot *s = &c->slots[k];
        if (kl1_pending(s->one) || kl1_broken(s->one))
            continue;
        kl1_drop_idle_draining(s->one);
        int up = kl1_connected(s->one);
        if (s->was_up && !up) {
            if (now - s->since_ms >= KL_RECONNECT_MAX_MS)
                s->delay_ms = KL_RECONNECT_MIN_MS;
            s->was_up = 0;
            backoff(s, now);
        } else if (up && !s->was_up) {
            came_up(s, now); /* reconnected by its own calls */
        }
        if (up && kl1_away(s->one) && now >= s->retry_at_ms) {
            kiln_error e;
            if (kl1_go_home(s->one, &e))
                backoff(s, kl_now_ms()); /* still away (or down): probe again later */
            else
                came_up(s, kl_now_ms()), s->delay_ms = KL_RECONNECT_MIN_MS;
            continue;
        }
        if (up || now < s->retry_at_ms)
            continue;
        kiln_error e;
        if (kl1_reconnect_home(s->one, &e))
            backoff(s, kl_now_ms());
        else
            came_up(s, kl_now_ms());
    }
}

static int usable(const kl_slot *s) {
    return kl1_connected(s->one) && !kl1_going_away(s->one);
}

/* The slot for a new request (see the top of the file). */
static kl_slot *pick(kiln_client *c) {
    if (c->n == 1)
        return &c->slots[0];
    revive(c);
    int best = -1, best_load = 0;
    for (int k = 0; k < c->n; k++) {
        int i = (c->next + k) % c->n;
        if (!usable(&c->slots[i]))
            continue;
        int load = kl1_pending(c->slots[i].one);
        if (best < 0 || load < best_load)
            best = i, best_load = load;
    }
    if (best < 0)
        best = c->next; /* nothing usable: it reconnects (failover) or gets 503 draining */
    c->next = (best + 1) % c->n;
    c->last = best;
    return &c->slots[best];
}

/* ------------------------------------------------------------------ connect, close */

static void free_pool(kiln_client *c) {
    for (int k = 0; k < c->n; k++)
        kl1_close(c->slots[k].one);
    free(c->slots);
    free(c);
}

/* A pool with room for want connections, first in slot 0 (the caller adds the others,
 * c->n counting them). NULL with first closed when out of memory. */
static kiln_client *pool_new(kl_one *first, int want, kiln_error *err) {
    kiln_client *c = calloc(1, sizeof *c);
    kl_slot *slots = c ? calloc((size_t)want, sizeof *slots) : NULL;
    if (!slots) {
        free(c);
        kl1_close(first);
        kl_err(err, KILN_ENOMEM, "out of memory");
        return NULL;
    }
    c->slots = slots;
    c->n = 1;
    slots[0].one = first;
    for (int k = 0; k < want; k++)
        slots[k].delay_ms = KL_RECONNECT_MIN_MS;
    return c;
}

/* The first connection with failover and rounds: connecting fails only when that does
 * (c is freed then). 0 or a code. */
static int connect_first(kiln_client *c, kiln_error *err) {
    int r = kl1_reconnect(c->slots[0].one, err);
    if (r) {
        free_pool(c);
        return r;
    }
    came_up(&c->slots[0], kl_now_ms());
    return 0;
}

kiln_client *kiln_connect(const kiln_options *o, kiln_error *err) {
    if (err)
        *err = (kiln_error){0, ""};
    kl_one *first = kl1_new(o, 0, err); /* checks o */
    if (!first)
        return NULL;
    int per = o->connections_per_host > 0 ? o->connections_per_host : 1;
    int boxes = kl1_n_boxes(first);
    if (per > KL_MAX_CONNS || (long)boxes * per > KL_MAX_CONNS) {
        kl_err(err, KILN_EINVAL, "%d boxes x %d connections_per_host: at most %d connections",
               boxes, per, KL_MAX_CONNS);
        kl1_close(first);
        return NULL;
    }
    kiln_client *c = pool_new(first, boxes * per, err);
    if (!c)
        return NULL;
    for (int k = 1; k < boxes * per; k++, c->n++) {
        c->slots[k].one = kl1_new(o, k, err);
        if (!c->slots[k].one) {
            free_pool(c);
            return NULL;
        }
    }
    if (connect_first(c, err))
        return NULL;
    for (int k = 1; k < c->n; k++) {
        kiln_error e;
        if (kl1_reconnect_home(c->slots[k].one, &e))
            backoff(&c->slots[k], kl_now_ms());
        else
            came_up(&c->slots[k], kl_now_ms());
    }
    return c;
}

/* A raw stream is a pool of exactly one raw connection (connections_per_host is not
 * read): with c->n == 1 every call is that kl_one's own, kiln_close included, and
 * kiln_raw_* below hand it to raw.c. On a line-protocol client slot 0 is not raw, so
 * they answer KILN_EINVAL. */
kiln_client *kiln_raw_open(const kiln_options *o, int plain, kiln_error *err) {
    if (err)
        *err = (kiln_error){0, ""};
    kl_one *one = kl1_new_raw(o, plain, err); /* checks o */
    if (!one)
        return NULL;
    kiln_client *c = pool_new(one, 1, err);
    if (!c || connect_first(c, err))
        return NULL;
    return c;
}

int kiln_raw_write(kiln_client *c, const void *buf, size_t len, kiln_error *err) {
    return kl1_raw_write(c->slots[0].one, buf, len, err);
}

long kiln_raw_read(kiln_client *c, void *buf, size_t cap, int timeout_ms, kiln_error *err) {
    return kl1_raw_read(c->slots[0].one, buf, cap, timeout_ms, err);
}

void kiln_raw_hangup(kiln_client *c) { kl1_raw_hangup(c->slots[0].one); }

void kiln_close(kiln_client *c) {
    if (c)
        free_pool(c);
}

const char *kiln_model(const kiln_client *c) { return kl1_model(c->slots[c->last].one); }
long kiln_ctx(const kiln_client *c) { return kl1_ctx(c->slots[c->last].one); }
long kiln_session(const kiln_client *c) { return kl1_session(c->slots[c->last].one); }
const char *kiln_role(const kiln_client *c) { return kl1_role(c->slots[c->last].one); }
const char *kiln_server(const kiln_client *c) { return kl1_server(c->slots[c->last].one); }

int kiln_connected(const kiln_client *c) {
    for (int k = 0; k < c->n; k++)
        if (kl1_connected(c->slots[k].one))
            return 1;
    return 0;
}

/* ------------------------------------------------------------------ requests */

kiln_req kiln_submit(kiln_client *c, const kiln_gen *p, const kiln_callbacks *cb, void *ud,
                     kiln_error *err) {
    kl_slot *s = pick(c);
    kiln_req h = kl1_submit(s->one, p, cb, ud, err);
    if (!h)
        return 0;
    return h << KL_CONN_BITS | (kiln_req)(s - c->slots);
}

int kiln_cancel(kiln_client *c, kiln_req h, kiln_error *err) {
    size_t k = (size_t)(h & (KL_MAX_CONNS - 1));
    if (k >= (size_t)c->n) {
        kl_err(err, KILN_EINVAL, "no such request");
        return KILN_EINVAL;
    }
    return kl1_cancel(c->slots[k].one, h >> KL_CONN_BITS, err);
}

int kiln_pending(const kiln_client *c) {
    int n = 0;
    for (int k = 0; k < c->n; k++)
        n += kl1_pending(c->slots[k].one);
    return n;
}

/* Each connection's own pump without waiting, then a poll over those with requests on
 * the wire, in slices short enough for retries and io timeouts to be run on time. */
int kiln_pump(kiln_client *c, int timeout_ms, kiln_error *err) {
    if (c->n == 1)
        return kl1_pump(c->slots[0].one, timeout_ms, err);
    if (err)
        *err = (kiln_error){0, ""};
    int64_t end = timeout_ms < 0 ? INT64_MAX : kl_now_ms() + timeout_ms;
    for (;;) {
        int total = 0, rc = 0;
        struct pollfd fds[KL_MAX_CONNS];
        nfds_t m = 0;
        for (int k = 0; k < c->n; k++) {
            kl_one *one = c->slots[k].one;
            if (!kl1_pending(one))
                continue;
            kiln_error e;
            int r = kl1_pump(one, 0, &e);
            if (r < 0 && !rc) {
                rc = r;
                if (err)
                    *err = e;
            }
            total += kl1_pending(one);
            if (kl1_pending(one) && kl1_fd(one) >= 0)
                fds[m++] = (struct pollfd){.fd = kl1_fd(one), .events = POLLIN};
        }
        if (rc)
            return rc; /* as one connection's pump: the lost requests have had on_end */
        int64_t now = kl_now_ms();
        if (!total || now >= end)
            return total;
        int w = end - now > KL_POLL_SLICE_MS ? KL_POLL_SLICE_MS : (int)(end - now);
        if (m)
            (void)poll(fds, m, w);
        else
            kl_sleep_ms(w); /* only retries waiting */
    }
}

int kiln_generate(kiln_client *c, const kiln_gen *p, kiln_on_token on_token, void *ud,
                  kiln_usage *usage, kiln_error *err) {
    return kl1_generate(pick(c)->one, p, on_token, ud, usage, err);
}

/* ------------------------------------------------------------------ verbs */

int kiln_health(kiln_client *c, kiln_health_info *h, kiln_error *err) {
    return kl1_health(pick(c)->one, h, err);
}

int kiln_stats(kiln_client *c, kiln_stats_info *s, kiln_error *err) {
    return kl1_stats(pick(c)->one, s, err);
}

char *kiln_metrics(kiln_client *c, size_t *len, kiln_error *err) {
    return kl1_metrics(pick(c)->one, len, err);
}

int kiln_command(kiln_client *c, const char *line, char *reply, size_t cap, kiln_error *err) {
    return kl1_command(pick(c)->one, line, reply, cap, err);
}

char *kiln_command_body(kiln_client *c, const char *line, size_t *len, kiln_error *err) {
    return kl1_command_body(pick(c)->one, line, len, err);
}

int kiln_update(kiln_client *c, const char *path, int tries, kiln_on_progress on_progress,
                void *ud, char *reply, size_t cap, kiln_error *err) {
    return kl1_update(pick(c)->one, path, tries, on_progress, ud, reply, cap, err);
}
