/* cost: what a step costs, learned from the steps the backend ran.
 *
 * A step's time is modelled as t ≈ a + b·tokens + c·positions: tokens counts every
 * token the step computes, positions the sum of the tokens' positions (the attention
 * work: a token at position p reads p keys). a is what any step pays (the weights read
 * once, the threads' hand-offs), b a token's matmuls, c a key read. (A cost per
 * sequence was tried: on a server's steps, nearly all of one or two sequences, it
 * cannot be told from a, and it took a's place.) The three are fit by least squares
 * over the steps seen, each weighing COST_LAMBDA times the one after it (about the last
 * 50 count), no coefficient below 0, pulled a little toward the last fit: sums of the
 * weighted steps are kept and the fit is solved again after each step (a 3x3 system per
 * subset of the features). So the model follows the machine (other load, a ladder
 * rung, a longer context) and keeps what it knew of a coefficient that recent steps
 * did not exercise (say, prompt chunks after an hour of decodes). The engine asks it what a prefill chunk would
 * add to a step (cost_chunk) to keep the steps other clients wait on near a latency
 * target (sched/engine.h, itl_target_ms). The errors fit are relative (a step weighs
 * 1/t²): the short steps a target is taken from matter as much as the long ones. Times
 * in milliseconds, positions in thousands. No allocation; a few thousand flops a step. */
#ifndef KILN_COST_H
#define KILN_COST_H

#define COST_N 3         /* 1, tokens, thousands of positions */
#define COST_MIN_STEPS 8 /* steps observed before a prediction is trusted */
/* Decode-only steps are also remembered by their width (1..COST_WIDE sequences), as
 * measured: on a loaded machine the smallest steps cost more than the line through all
 * the others says (a one-token step measured 3-5 ms where the fit said 8), and the
 * latency target is taken from them. A measurement older than COST_RECENT steps is not
 * used. */
#define COST_WIDE 64
#define COST_RECENT 2000

typedef struct {
    double S[COST_N][COST_N]; /* Σ weight·x·xᵀ */
    double r[COST_N];         /* Σ weight·x·t */
    double tt;                /* Σ weight·t² */
    double w[COST_N];         /* the fit: a, b, c (each ≥ 0) */
    int n;                    /* steps observed */
    double wide_ms[COST_WIDE + 1]; /* decode-only steps of k sequences: a moving average */
    int wide_at[COST_WIDE + 1];    /* n when last seen; 0: never */
} cost_model;

void cost_init(cost_model *m);
/* One step: its tokens, the sum of their positions, what it took, and whether every
 * token was a sequence's decode. */
void cost_observe(cost_model *m, int tokens, double positions, double ms, int decodes);
/* 1 once enough steps were seen to trust a prediction. */
int cost_ready(const cost_model *m);
/* The predicted time of a step (ms, ≥ 0). */
double cost_step(const cost_model *m, int tokens, double positions);
/* The same for a step of `tokens` decodes alone: what such steps took lately when one
 * was measured in the last COST_RECENT steps, else the prediction. */
double cost_decodes(const cost_model *m, int tokens, double positions);
/* What k tokens of a sequence, at its positions pos .. pos+k-1, add to a step (ms; 0
 * for k = 0). */
double cost_tokens(const cost_model *m, int pos, int k);
/* The most tokens of a sequence, from position `pos` on, that add at most `ms`
 * to a step (0 when not even one does; `most` when all of those fit). */
int cost_chunk(const cost_model *m, int pos, int most, double ms);

#endif
