/* model_fixture.h: the real model for the unit tests that run it: $MODEL, or the
 * default model of `make model`, with its tokenizer. */
#ifndef KILN_TESTS_MODEL_FIXTURE_H
#define KILN_TESTS_MODEL_FIXTURE_H

#include <stdio.h>
#include <stdlib.h>

#include "core/model.h"
#include "core/tokenizer.h"

/* 0, or -1 after saying on stderr why (`who` names the test). */
static inline int fixture_load(model *m, tok_t *tok, const char *who) {
    const char *path = getenv("MODEL") ? getenv("MODEL") : "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    char err[512];
    if (model_load(m, path, err, sizeof err) < 0 || tok_init_gguf(tok, &m->gguf, err, sizeof err) < 0) {
        fprintf(stderr, "%s: cannot load %s: %s\n", who, path, err);
        return -1;
    }
    return 0;
}

#endif
