/* test_ladder: the degrade ladder's state machine, tick by tick: the climb 0 -> 1 (batch
 * halving to 1) -> 2 -> 3 with and without 8-bit KV, hysteresis between the thresholds,
 * the hold before each step down, the batch restored step by step, pinning, restart,
 * and the transition counts. */
#include <errno.h>

#include "sched/ladder.h"
#include "tests/unit/check.h"

static const ladder_config CFG = {0.9, 0.8, 1000, 32, 1};

static void climbs_in_order(void) {
    ladder l;
    CHECK(ladder_init(&l, &CFG) == 0, "init");
    CHECK(l.level == 0 && l.batch == 32 && l.pinned == -1, "start");
    CHECK(ladder_tick(&l, 0.5, 0) == 0 && l.level == 0, "low pressure: nothing");
    int64_t t = 0;
    int want[] = {16, 8, 4, 2, 1};
    for (int i = 0; i < 5; i++) {
        CHECK(ladder_tick(&l, 0.95, t += 100) == 1, "tick %d acts", i);
        CHECK(l.level == 1 && l.batch == want[i], "shrink: level %d batch %d, want 1/%d", l.level,
              l.batch, want[i]);
    }
    CHECK(ladder_tick(&l, 0.95, t += 100) == 1 && l.level == 2 && l.batch == 1, "compact at batch 1");
    CHECK(ladder_tick(&l, 0.95, t += 100) == 1 && l.level == 3, "shed");
    CHECK(ladder_tick(&l, 0.99, t += 100) == 0 && l.level == 3, "shed is the top of the climb");
    CHECK(l.transitions[0][1] == 1 && l.transitions[1][2] == 1 && l.transitions[2][3] == 1,
          "transitions counted");

    /* between the thresholds: no movement, and the hold does not start */
    CHECK(ladder_tick(&l, 0.85, t += 5000) == 0 && l.level == 3, "hysteresis band");
    /* below: a hold of 1000 ms before each rung */
    CHECK(ladder_tick(&l, 0.5, t += 100) == 0 && l.level == 3, "hold starts");
    CHECK(ladder_tick(&l, 0.5, t += 900) == 0 && l.level == 3, "hold not over at 900 ms");
    CHECK(ladder_tick(&l, 0.5, t += 100) == 1 && l.level == 2, "3 -> 2 after the hold");
    CHECK(ladder_tick(&l, 0.5, t += 500) == 0 && l.level == 2, "hold again before 2 -> 1");
    CHECK(ladder_tick(&l, 0.5, t += 500) == 1 && l.level == 1 && l.batch == 1, "2 -> 1");
    CHECK(ladder_tick(&l, 0.5, t += 1000) == 1 && l.level == 1 && l.batch == 2, "batch doubles");
    int back[] = {4, 8, 16, 32};
    for (int i = 0; i < 4; i++)
        CHECK(ladder_tick(&l, 0.5, t += 100) == 1 && l.batch == back[i], "batch %d", back[i]);
    CHECK(l.level == 1, "still shrink while the batch is restored");
    /* the hold since 2 -> 1 has long passed: the full batch leads straight to normal */
    CHECK(ladder_tick(&l, 0.5, t += 100) == 1 && l.level == 0 && l.batch == 32, "back to normal");
    CHECK(ladder_tick(&l, 0.1, t += 5000) == 0 && l.level == 0, "normal stays");
    CHECK(l.transitions[3][2] == 1 && l.transitions[2][1] == 1 && l.transitions[1][0] == 1, "down counted");
}

static void no_kv8_passes_through(void) {
    ladder_config c = CFG;
    c.has_kv8 = 0, c.max_batch = 2;
    ladder l;
    ladder_init(&l, &c);
    int64_t t = 0;
    CHECK(ladder_tick(&l, 1.0, t += 10) == 1 && l.level == 1 && l.batch == 1, "shrink to 1");
    CHECK(ladder_tick(&l, 1.0, t += 10) == 1 && l.level == 3, "no 8-bit KV: straight past 2 to shed");
    CHECK(l.transitions[1][2] == 1 && l.transitions[2][3] == 1, "the pass through rung 2 is counted");
    CHECK(ladder_tick(&l, 0.0, t += 10) == 0, "hold starts");
    CHECK(ladder_tick(&l, 0.0, t += 1000) == 1 && l.level == 1, "3 -> 1: rung 2 skipped down too");
}

static void pinning(void) {
    ladder l;
    ladder_init(&l, &CFG);
    CHECK(ladder_pin(&l, 3) == 1 && l.level == 3 && l.pinned == 3, "pin shed");
    CHECK(ladder_tick(&l, 0.0, 10000) == 1 && l.level == 3 && l.batch == 16, "pinned: batch halves");
    for (int i = 0; i < 10; i++) ladder_tick(&l, 0.0, 20000 + i);
    CHECK(l.level == 3 && l.batch == 1, "pinned level holds at any pressure, batch 1");
    CHECK(ladder_pin(&l, 0) == 1 && l.level == 0, "pin normal");
    for (int i = 0; i < 10; i++) ladder_tick(&l, 1.0, 30000 + i);
    CHECK(l.level == 0 && l.batch == 32, "pinned normal ignores pressure, batch restored");
    CHECK(ladder_pin(&l, -1) == 1 && l.pinned == -1, "unpin");
    CHECK(ladder_tick(&l, 1.0, 40000) == 1 && l.level == 1, "automatic again");
    CHECK(ladder_pin(&l, 4) == -EINVAL && ladder_pin(&l, -2) == -EINVAL, "restart cannot be pinned");
    ladder_restart(&l);
    CHECK(l.level == 4 && ladder_tick(&l, 0.0, 99999) == 0 && ladder_pin(&l, 0) == -EINVAL,
          "restart is final");
}

static void bad_config(void) {
    ladder l;
    ladder_config c = CFG;
    c.down = 0.95;
    CHECK(ladder_init(&l, &c) == -EINVAL, "down above up");
    c = CFG, c.max_batch = 0;
    CHECK(ladder_init(&l, &c) == -EINVAL, "batch 0");
    c = CFG, c.up = 1.5;
    CHECK(ladder_init(&l, &c) == -EINVAL, "up above 1");
}

int main(void) {
    climbs_in_order();
    no_kv8_passes_through();
    pinning();
    bad_config();
    return check_done("ladder");
}
