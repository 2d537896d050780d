/* kl.h: KL(p || q) of the softmaxes of two logit rows, in nats, computed in double: one
 * copy for the programs that hold a run's logits against a reference's (test_kv8,
 * gpu_test, gpu_bench). */
#ifndef KILN_TESTS_KL_H
#define KILN_TESTS_KL_H

#include <math.h>

static inline double kl_logits(const float *p, const float *q, int n) {
    double mp = -INFINITY, mq = -INFINITY, sp = 0, sq = 0, kl = 0;
    for (int i = 0; i < n; i++) mp = fmax(mp, p[i]), mq = fmax(mq, q[i]);
    for (int i = 0; i < n; i++) sp += exp(p[i] - mp), sq += exp(q[i] - mq);
    for (int i = 0; i < n; i++) {
        double lp = p[i] - mp - log(sp), lq = q[i] - mq - log(sq);
        kl += exp(lp) * (lp - lq);
    }
    return kl;
}

#endif
