/* metrics: counters, gauges and histograms rendered in the Prometheus text format
 * (version 0.0.4), for GET /metrics and the METRICS verb.
 *
 * A registry is sized at creation and allocates nothing afterwards. A metric family
 * has a name, help text and type; a family may have several series told apart by a
 * fixed label string (e.g. `from="0",to="1"`), each registered once. Updates are
 * plain stores from the loop's thread (no atomics: one thread owns the registry).
 * Names follow Prometheus conventions: base units (seconds, bytes), counters end in
 * _total. */
#ifndef KILN_METRICS_H
#define KILN_METRICS_H

#include <stddef.h>

enum { MET_COUNTER, MET_GAUGE, MET_HISTOGRAM };

#define MET_MAX_BUCKETS 32

typedef struct metrics metrics;

/* Room for max_series series in all. NULL on out of memory. */
metrics *met_new(int max_series);
void met_free(metrics *m);

/* Register a series; returns its handle (>= 0), or -EINVAL (bad name, labels or
 * buckets; a name reused with another type or help), -EEXIST (same name and labels),
 * -ENOSPC. labels: NULL or "" for none, else `k="v",k2="v2"` as it will be printed.
 * Histograms take n_buckets upper bounds in increasing order (+Inf is implicit). */
int met_add_counter(metrics *m, const char *name, const char *help, const char *labels);
int met_add_gauge(metrics *m, const char *name, const char *help, const char *labels);
int met_add_histogram(metrics *m, const char *name, const char *help, const char *labels,
                      const double *buckets, int n_buckets);

void met_inc(metrics *m, int h, double v); /* counter += v (v >= 0), gauge += v */
void met_set(metrics *m, int h, double v); /* gauge = v (counters: ignored) */
void met_observe(metrics *m, int h, double v); /* histogram */
double met_value(const metrics *m, int h); /* counter/gauge value, histogram count */

/* The whole registry, families in registration order (HELP and TYPE once per family),
 * NUL-terminated. The length, or -ENOSPC (out holds a truncated prefix). */
int met_render(const metrics *m, char *out, size_t cap);

#endif
