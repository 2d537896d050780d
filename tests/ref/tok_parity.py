#!/usr/bin/env python3
"""Tokenizer parity: kilnd's tokenizer against Hugging Face `tokenizers`.

The reference is built from the GGUF's own vocabulary and merges (read with the `gguf`
package), with the pre-tokenizer its tokenizer.ggml.pre names, as the model's
tokenizer.json has it: smollm/starcoder/refact (Digits(individual_digits=True), then
ByteLevel(add_prefix_space=False, use_regex=True)), llama-bpe (Llama 3's Split regex,
then ByteLevel without its regex; BPE with ignore_merges), qwen2 or qwen35 (Qwen2's or
Qwen3.5's Split regex, then ByteLevel; Qwen2's NFC normalizer is left out, as llama.cpp and kiln leave it out),
the ByteLevel decoder, and every control token (token_type 3) added as a special token. For each corpus item (one JSON
string per line) it compares the ids of `kilnd tokenize --hex --special` and the text of
`kilnd detokenize --hex` (special tokens skipped, as HF's decode does by default).

Usage: tok_parity.py --kilnd build/gnu/kilnd --model M.gguf --corpus tests/data/tok_corpus.jsonl
Prints one line per mismatch and "tokenizer parity: N passed, M failed"; exits 1 on any.
"""
import argparse
import json
import subprocess
import sys

from gguf import GGUFReader
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models
from tokenizers import pre_tokenizers as pre

# the Split regexes of the models' tokenizer.json files (Llama 3: digits in threes; Qwen2:
# one digit per piece)
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = _LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")
PRE_REGEX = {"llama-bpe": _LLAMA3, "llama3": _LLAMA3, "qwen2": _QWEN2,
             "qwen35": _QWEN2.replace(r"?\p{L}+", r"?[\p{L}\p{M}]+").replace(r"[^\s\p{L}\p{N}]", r"[^\s\p{L}\p{M}\p{N}]")}


def field(reader, key):
    f = reader.fields.get(key)
    return f.contents() if f is not None else None


def reference(path):
    r = GGUFReader(path)
    model = field(r, "tokenizer.ggml.model")
    if model != "gpt2":
        sys.exit("tok_parity: only byte-level BPE (gpt2) models are supported, not %r" % model)
    tokens = field(r, "tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in field(r, "tokenizer.ggml.merges")]
    types = field(r, "tokenizer.ggml.token_type") or [1] * len(tokens)
    kind = field(r, "tokenizer.ggml.pre") or "gpt2"
    vocab = {}
    for i, t in enumerate(tokens):
        vocab[t] = i
    if kind in ("smollm", "starcoder", "refact"):
        tk = Tokenizer(models.BPE(vocab, merges))
        tk.pre_tokenizer = pre.Sequence([pre.Digits(individual_digits=True),
                                         pre.ByteLevel(add_prefix_space=False, use_regex=True)])
    elif kind in PRE_REGEX:
        tk = Tokenizer(models.BPE(vocab, merges, ignore_merges=kind in ("llama-bpe", "llama3")))
        tk.pre_tokenizer = pre.Sequence([pre.Split(Regex(PRE_REGEX[kind]), behavior="isolated"),
                                         pre.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        sys.exit("tok_parity: no reference for tokenizer.ggml.pre %r" % kind)
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False)
                           for t, ty in zip(tokens, types) if ty == 3])
    return tk


def run(cmd, data):
    p = subprocess.run(cmd, input=data, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if p.returncode != 0:
        sys.exit("tok_parity: %s failed (%d): %s" % (" ".join(cmd), p.returncode,
                                                      p.stderr.decode(errors="replace")))
    return p.stdout.decode().split("\n")


def first_diff(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kilnd", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--corpus", required=True)
    args = ap.parse_args()
    with open(args.corpus, encoding="utf-8") as f:
        items = [json.loads(line) for line in f if line.strip()]
    tk = reference(args.model)

    hexin = "".join(s.encode("utf-8").hex() + "\n" for s in items).encode()
    got_ids = run([args.kilnd, "tokenize", "--model", args.model, "--hex", "--special"], hexin)
    want = [tk.encode(s).ids for s in items]
    # decode the reference ids, so a decode mismatch is not just an encode mismatch again
    idsin = "".join(" ".join(map(str, w)) + "\n" for w in want).encode()
    got_text = run([args.kilnd, "detokenize", "--model", args.model, "--hex"], idsin)

    passed = failed = 0
    for i, s in enumerate(items):
        ok = True
        got = [int(x) for x in got_ids[i].split()] if i < len(got_ids) else None
        if got != want[i]:
            ok = False
            if got is None:
                print("item %d %r: encode: no output line" % (i, s[:40]))
            else:
                k = first_diff(got, want[i])
                print("item %d %r: encode differs at %d: kiln %s, hf %s" %
                      (i, s[:40], k, got[k:k + 5], want[i][k:k + 5]))
        ref_text = tk.decode(want[i])
        text = bytes.fromhex(got_text[i]).decode("utf-8", errors="replace") if i < len(got_text) else None
        if text != ref_text:
            ok = False
            k = first_diff(text or "", ref_text)
            print("item %d %r: decode differs at char %d: kiln %r, hf %r" %
                  (i, s[:40], k, (text or "")[k:k + 10], ref_text[k:k + 10]))
        passed += ok
        failed += not ok
    print("tokenizer parity: %d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
