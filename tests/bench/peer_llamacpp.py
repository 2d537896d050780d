#!/usr/bin/env python3
"""Peer benchmark: llama.cpp (through llama-cpp-python) on the same GGUF.

Measures, with N threads:
  prefill: wall time of one llm.eval() of P prompt tokens from an empty context
  decode : wall time of G single-token llm.eval() calls continuing after it
Repeats R times and keeps the best of each.  Prints
  bench: prefill_tok_s=X decode_tok_s=Y
the same line `kilnd bench` prints.
"""
import argparse
import os
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()

    import llama_cpp
    from llama_cpp import Llama

    n_ctx = a.prompt_tokens + a.gen_tokens + 16
    llm = Llama(model_path=a.model, n_ctx=n_ctx, n_threads=a.threads,
                n_threads_batch=a.threads, n_batch=a.prompt_tokens,
                n_ubatch=min(a.prompt_tokens, 512), logits_all=False, verbose=False)
    n_vocab = llm.n_vocab()
    # deterministic, ordinary (non-control) token ids
    prompt = [100 + (i * 7919) % (n_vocab - 100) for i in range(a.prompt_tokens)]

    # untimed warm-up: page in the mmapped weights, size the compute buffers
    llm.eval(prompt[:64])
    llm.eval([prompt[0]])

    best_p = best_d = 0.0
    for r in range(a.repeat):
        llm.reset()  # n_tokens = 0; eval() drops the KV cache past n_tokens
        t0 = time.perf_counter()
        llm.eval(prompt)
        t1 = time.perf_counter()
        tok = prompt[-1]
        t2 = time.perf_counter()
        for _ in range(a.gen_tokens):
            tok = (tok * 31 + 7) % (n_vocab - 100) + 100
            llm.eval([tok])
        t3 = time.perf_counter()
        p = a.prompt_tokens / (t1 - t0)
        d = a.gen_tokens / (t3 - t2)
        sys.stderr.write(f"peer: run {r + 1}: prefill {p:.1f} tok/s, decode {d:.1f} tok/s\n")
        best_p, best_d = max(best_p, p), max(best_d, d)
    print(f"peer: llama-cpp-python {llama_cpp.__version__}, model {os.path.basename(a.model)}, "
          f"threads {a.threads}")
    print(f"bench: prefill_tok_s={best_p:.1f} decode_tok_s={best_d:.1f}")


if __name__ == "__main__":
    main()
