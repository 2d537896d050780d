#!/usr/bin/env python3
"""Parity of kilnd against the independent NumPy reference (ref_llama.py).

  parity.py --kilnd build/gnu/kilnd --model models/X.gguf
  parity.py --model M --self-test     reference alone: continuation of one prompt
  parity.py --model M --calibrate     reference vs. the reference with 8-bit
                                      activations + f16 KV emulated (what the
                                      tolerances below are sized against); runs
                                      the exact same comparison as for kilnd

For each fixed prompt: ids from `kilnd tokenize --special`, then
`kilnd generate --prompt-ids ... --max-tokens 32 --temperature 0 --ids
--dump-logits FILE --threads 2`, compared with the reference's greedy ids and
the reference's logits at the last prompt position.

Tolerances (why):
  kilnd, like llama.cpp, rounds activations to 8-bit blocks of 32 for its integer
  dot products against the 4/8-bit weights and keeps the KV cache in f16, while
  the reference does everything in float32/float64 on the dequantized weights.
  On this small model (d=576, strong outlier channels) that rounding is far from
  negligible.  --calibrate measures it: the reference with exactly that rounding
  emulated, against the plain reference, on the prompts below, gives
     raw max|Δ| 0.45-1.42 (largely a constant shift of the logits, up to 0.7),
     shift-removed max|Δ| 0.41-0.83, KL 1.6e-3-9.3e-3
  (8-bit activations alone, without the f16 rounding, reach KL 2.4e-2 on the
  first prompt).  Softmax and argmax ignore a constant shift, so the bounds are:
     shift-removed max|Δ| <= LOGIT_REL_TOL * max|ref|  (5%: 1.07-1.69 here),
     KL(softmax(ref) || softmax(kilnd)) <= KL_TOL = 3e-2,
     top-1 of the dumped logits identical (unless the reference's top-2 gap is a
     near-tie),
  about 2x the measured rounding noise, yet far below what a real bug gives
  (wrong RoPE pairing, wrong GQA head mapping, missing norm, transposed weight:
  errors the size of the logits themselves, KL >> 1).  The raw max|Δ| and RMS
  are printed, not bounded.
  Generated ids must equal the reference's greedy ids, except at a near-tie:
  where the reference's top-2 gap at the first differing step is below NEAR_TIE
  (0.5 logits, comparable to the shift-removed noise above) the sequences may
  diverge; past that step every kilnd id is checked against the reference run
  on kilnd's own ids (teacher forcing) and must be its argmax or within NEAR_TIE
  of it, or else within NEAR_TIE of the argmax of the reference with kilnd's
  rounding emulated (the --calibrate model), teacher-forced the same way: far
  from the prompt the rounding noise grows (shift-removed max|Δ| 1.0-1.4 and KL
  2-8e-2 at some chatml-capital continuation steps, alike for the emulation and
  for kilnd builds whose summation orders differ), so a gap past 0.5 in the
  float reference can be the rounding's own choice; the emulation tells which.
  Near-ties are counted and printed.  This tiny model has many: in
  --calibrate 6 of 7 prompts diverge at a near-tie, at gaps of 0.005-0.08.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ref_llama  # noqa: E402

N_GEN = 32
LOGIT_REL_TOL = 0.05
KL_TOL = 3e-2
NEAR_TIE = 0.5
# --exact (kilnd with f32 activations): ~0.1 logits, KL 1e-4, near-tie 0.05
EXACT_REL_TOL = 0.005
EXACT_KL_TOL = 1e-4
EXACT_NEAR_TIE = 0.05

PROMPTS = [
    ("chatml-capital", ref_llama.chatml("What is the capital of France?")),
    ("chatml-code", ref_llama.chatml("Write a Python function that reverses a string.")),
    ("fr-accents", "Le café où j'ai rencontré Hélène était très agréable ; "
                   "nous avons parlé de l'été à Montréal et"),
    ("zh", "北京是中国的首都，也是一座历史悠久的城市。它的著名景点包括"),
    ("emoji", "My favourite foods are pizza 🍕, sushi 🍣 and ice cream 🍦 because"),
    ("code", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
             "    if n < 2:\n"),
    ("digits", "The year 1969 saw 3 astronauts travel 384400 km; in 2024, "),
]


def softmax64(x):
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - x.max())
    return e / e.sum()


def compare_logits(ref, got):
    """Returns (ok, metrics dict, reason)."""
    diff = got.astype(np.float64) - ref.astype(np.float64)
    d = np.abs(diff)
    dc = np.abs(diff - diff.mean())  # softmax is invariant to a constant shift
    p, q = softmax64(ref), softmax64(got)
    kl = float(np.sum(p * (np.log(p + 1e-300) - np.log(q + 1e-300))))
    m = {
        "maxabs": float(d.max()),
        "maxabs_c": float(dc.max()),
        "shift": float(diff.mean()),
        "rms": float(np.sqrt(np.mean(d * d))),
        "kl": kl,
        "tol": LOGIT_REL_TOL * float(np.abs(ref).max()),
        "top1_ref": int(np.argmax(ref)),
        "top1_got": int(np.argmax(got)),
    }
    reasons = []
    if not np.all(np.isfinite(got)):
        reasons.append("non-finite logits")
    if m["maxabs_c"] > m["tol"]:
        reasons.append(f"shift-removed max|Δ| {m['maxabs_c']:.3g} > {m['tol']:.3g}")
    if not (kl <= KL_TOL):
        reasons.append(f"KL {kl:.3g} > {KL_TOL}")
    if m["top1_ref"] != m["top1_got"]:
        gap = top2_gap(ref)
        if gap < NEAR_TIE:
            m["near_tie_top1"] = True
        else:
            reasons.append(f"top-1 {m['top1_got']} != ref {m['top1_ref']}")
    return not reasons, m, "; ".join(reasons)


def top2_gap(lg):
    t = np.partition(np.asarray(lg, dtype=np.float64), -2)[-2:]
    return float(t[1] - t[0])


def teacher_forced(model, prompt_ids, got_ids):
    """model's logits over kilnd's own continuation: row j is the step that chose id j."""
    model.reset()
    return model.forward(list(prompt_ids) + list(got_ids), 0)[len(prompt_ids) - 1:]


def compare_ids(ref, prompt_ids, ref_ids, ref_steps, got_ids, eog, emul=None):
    """Returns (ok, n_near_ties, note).

    Until the first difference the ids must equal the reference's greedy ids.
    A difference is allowed only at a near-tie (reference top-2 gap < NEAR_TIE);
    past it the sequences legitimately diverge, so the remaining kilnd ids are
    checked by teacher forcing: the reference is run on prompt + kilnd's own ids
    and every kilnd id must be the reference's argmax at that step, or within
    NEAR_TIE of it (another near-tie), or, where emul (the reference with
    kilnd's 8-bit rounding emulated) is given, within NEAR_TIE of emul's argmax.
    kilnd stops at an end-of-generation token; whether it prints that token or
    not, the reference must pick an EOG token at the same step."""
    n = len(got_ids)
    if n > N_GEN:
        return False, 0, f"{n} ids > --max-tokens {N_GEN}"
    for j, t in enumerate(got_ids[:-1]):
        if t in eog:
            return False, 0, f"kilnd did not stop at EOG token {t} (step {j})"
    early = n < N_GEN
    omitted = early and (n == 0 or got_ids[-1] not in eog)  # stop token not printed

    def stop_short(row):
        """How far below the reference's max the best EOG token is (0: argmax is EOG)."""
        return float(row.max() - max(row[e] for e in eog if e < len(row)))

    stop_note = (" (stopped at EOG)" if early and not omitted else
                 " (stopped at EOG, not printed)" if omitted else "")
    first = next((i for i in range(min(n, len(ref_ids))) if got_ids[i] != ref_ids[i]), None)
    if first is None:
        if omitted:
            if len(ref_ids) <= n:
                return False, 0, f"kilnd stopped after {n} ids, reference too (no EOG?)"
            short = stop_short(ref_steps[n])
            if short >= NEAR_TIE:
                return False, 0, (f"kilnd stopped after {n} ids; reference's EOG is "
                                  f"{short:.3f} below its argmax {ref_ids[n]}")
            return True, int(short > 0), f"{n}/{n} ids match{stop_note}" + (
                f"; near-tie stop (gap {short:.3f})" if short > 0 else "")
        if len(ref_ids) != n:
            return False, 0, (f"kilnd gave {n} ids, reference {len(ref_ids)}: "
                              f"stop token differs")
        return True, 0, f"{n}/{n} ids match{stop_note}"
    gap = top2_gap(ref_steps[first])
    if gap >= NEAR_TIE:
        return False, 0, (f"id mismatch at step {first}: got {got_ids[first]} ref "
                          f"{ref_ids[first]} (ref top-2 gap {gap:.3f} >= {NEAR_TIE})")
    ties = [f"{first}(gap {gap:.3f})"]
    lg = teacher_forced(ref, prompt_ids, got_ids)
    elg = None
    for j in range(first + 1, n):
        row = lg[j]
        best = int(np.argmax(row))
        if got_ids[j] == best:
            continue
        short = float(row[best] - row[got_ids[j]])
        if short < NEAR_TIE:
            ties.append(f"{j}(gap {short:.3f})")
            continue
        eshort = None
        if emul is not None:
            if elg is None:
                elg = teacher_forced(emul, prompt_ids, got_ids)
            eshort = float(elg[j].max() - elg[j][got_ids[j]])
        if eshort is None or eshort >= NEAR_TIE:
            return False, len(ties), (
                f"near-tie at step {first}, then teacher-forced mismatch at step {j}: got "
                f"{got_ids[j]}, ref argmax {best} is {short:.3f} higher (>= {NEAR_TIE})"
                + (f", {eshort:.3f} in the 8-bit emulation" if eshort is not None else ""))
        ties.append(f"{j}(gap {short:.3f}, emulated {eshort:.3f})")
    if omitted:
        short = stop_short(lg[n])
        if short >= NEAR_TIE:
            return False, len(ties), (f"kilnd stopped after {n} ids; teacher-forced "
                                      f"reference's EOG is {short:.3f} below its argmax")
        if short > 0:
            ties.append(f"{n}:stop(gap {short:.3f})")
    return True, len(ties), (f"{first}/{n} ids match greedy ref, then near-tie at step "
                             f"{ties[0]}; rest consistent with teacher-forced ref{stop_note}; "
                             f"near-tie steps: {' '.join(ties)}")


def run(cmd, timeout):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=timeout, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:2])} exited {p.returncode}: "
                           f"{p.stderr.strip()[-300:]}")
    return p.stdout


def parse_ids(s):
    """Ids from the last line of output; an empty output is zero ids (a model may
    stop at once).  Anything that is not an integer raises."""
    lines = [ln for ln in s.strip().splitlines() if ln.strip()]
    if not lines:
        return []
    try:
        return [int(x) for x in lines[-1].replace(",", " ").split()]
    except ValueError:
        raise RuntimeError(f"expected ids, got: {lines[-1][:200]!r}")


class KilndSide:
    def __init__(self, kilnd, model, threads, timeout, exact=False):
        self.kilnd, self.model, self.threads, self.timeout = kilnd, model, threads, timeout
        self.exact = exact

    def tokenize(self, text):
        return parse_ids(run([self.kilnd, "tokenize", "--model", self.model, "--special",
                              "--text", text], self.timeout))

    def generate(self, ids, n_vocab):
        with tempfile.TemporaryDirectory() as td:
            f = os.path.join(td, "logits.f32")
            out = run([self.kilnd, "generate", "--model", self.model,
                       "--prompt-ids", ",".join(map(str, ids)), "--max-tokens", str(N_GEN),
                       "--temperature", "0", "--ids", "--dump-logits", f,
                       "--threads", str(self.threads)] + (["--exact"] if self.exact else []),
                      self.timeout)
            if not os.path.exists(f):
                raise RuntimeError("kilnd wrote no --dump-logits file")
            lg = np.fromfile(f, dtype="<f4")
        if lg.size != n_vocab:
            raise RuntimeError(f"logits file has {lg.size} floats, expected n_vocab={n_vocab}")
        return parse_ids(out), lg


class EmulatedSide:
    """--calibrate: the reference itself with 8-bit activations / f16 KV."""
    def __init__(self, model_path, hf):
        self.m = ref_llama.load(model_path, emulate_q8=True)
        self.hf = hf

    def tokenize(self, text):
        return self.hf.encode(text).ids

    def generate(self, ids, n_vocab):
        got, lg = ref_llama.greedy(self.m, ids, N_GEN, stop_ids=self.m.eog_ids())
        return got, lg


def main(argv=None):
    ap = argparse.ArgumentParser(description="kilnd vs NumPy reference parity")
    ap.add_argument("--kilnd", default=None)
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--self-test", action="store_true",
                    help="run the reference alone on one prompt and print its continuation")
    ap.add_argument("--calibrate", action="store_true",
                    help="compare the reference with its own 8-bit-activation emulation")
    ap.add_argument("--exact", action="store_true",
                    help="run kilnd with --exact (f32 activations) and tight tolerances")
    ap.add_argument("--only", default=None, help="comma-separated prompt names")
    a = ap.parse_args(argv)

    if not os.path.exists(a.model):
        print(f"parity: model not found: {a.model}")
        return 2
    t0 = time.time()
    ref = ref_llama.load(a.model)
    eog = ref.eog_ids()

    if a.self_test:
        hf = ref.hf_tokenizer()
        text = PROMPTS[0][1]
        ids = hf.encode(text).ids
        out, lg = ref_llama.greedy(ref, ids, N_GEN, stop_ids=eog)
        print(f"self-test: prompt {len(ids)} ids, top-1 {int(np.argmax(lg))} "
              f"max|logit| {np.abs(lg).max():.2f}")
        print(f"self-test: ids {' '.join(map(str, out))}")
        print(f"self-test: {ref.detok(out)!r}")
        ok = len(out) > 0 and np.all(np.isfinite(lg))
        print(f"parity: {int(ok)} passed, {int(not ok)} failed")
        return 0 if ok else 1

    if a.calibrate:
        side = EmulatedSide(a.model, ref.hf_tokenizer())
        label = "emulated-q8"
    else:
        if not a.kilnd or not (os.path.isfile(a.kilnd) and os.access(a.kilnd, os.X_OK)):
            print(f"parity: kilnd binary not found or not executable: {a.kilnd}")
            print(f"parity: 0 passed, {len(PROMPTS)} failed")
            return 1
        side = KilndSide(a.kilnd, a.model, a.threads, a.timeout, a.exact)
        label = "kilnd"
        if a.exact:
            # f32 activations: only the f16 KV cache (and summation order) differ
            # from the reference; emulating f16 q/k/v alone gave max|Δ| 0.016,
            # KL 2e-6 on the first prompt.
            global LOGIT_REL_TOL, KL_TOL, NEAR_TIE
            LOGIT_REL_TOL, KL_TOL, NEAR_TIE = EXACT_REL_TOL, EXACT_KL_TOL, EXACT_NEAR_TIE

    try:
        hf = ref.hf_tokenizer()
    except Exception:  # tokenizer cross-check is informational only
        hf = None

    # kilnd's default path rounds as the emulation does; --exact and --calibrate
    # are judged against the float reference alone
    emul = None
    if label == "kilnd" and not a.exact:
        emul = ref_llama.load(a.model, emulate_q8=True)

    prompts = PROMPTS
    if a.only:
        want = set(a.only.split(","))
        prompts = [p for p in PROMPTS if p[0] in want]
    passed = failed = near_ties = 0
    for name, text in prompts:
        try:
            ids = side.tokenize(text)
            if not ids:
                raise RuntimeError("tokenize returned no ids")
            got_ids, got_lg = side.generate(ids, ref.n_vocab)
        except Exception as e:  # subprocess failure, timeout, bad output
            failed += 1
            print(f"FAIL {name}: {label} error: {e}")
            continue
        note = ""
        if hf is not None and label == "kilnd":
            hid = hf.encode(text).ids
            if hid != ids:
                note = " [note: kilnd tokenize differs from HF tokenizers]"
        ref_ids, ref_lg, ref_steps = ref_llama.greedy(ref, ids, N_GEN, stop_ids=eog,
                                                      return_step_logits=True)
        lok, m, lwhy = compare_logits(ref_lg, got_lg)
        iok, nt, iwhy = compare_ids(ref, ids, ref_ids, ref_steps, got_ids, eog, emul)
        near_ties += max(nt, int(bool(m.get("near_tie_top1"))))
        ok = lok and iok
        passed += ok
        failed += not ok
        print(f"{'PASS' if ok else 'FAIL'} {name}: {len(ids)} prompt ids; {iwhy}; "
              f"logits max|Δ|={m['maxabs']:.3f} (shift {m['shift']:+.3f}, shift-removed "
              f"{m['maxabs_c']:.3f}, tol {m['tol']:.3f}) rms={m['rms']:.3f} "
              f"KL={m['kl']:.2e} top1 {m['top1_got']}/{m['top1_ref']}"
              + (f"; {lwhy}" if lwhy else "") + note)
        if not iok:
            print(f"     ref  : {' '.join(map(str, ref_ids))}  {ref.detok(ref_ids)!r}")
            print(f"     {label}: {' '.join(map(str, got_ids))}  {ref.detok(got_ids)!r}")
        sys.stdout.flush()
    print(f"parity: near-ties: {near_ties}; {time.time() - t0:.0f}s")
    print(f"parity: {passed} passed, {failed} failed")
    return 0 if failed == 0 and passed > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
