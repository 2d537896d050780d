#!/usr/bin/env python3
"""Vocabulary parity: kilnd's tokenizer against llama.cpp's own tokenizer tests.

llama.cpp's source tree ships GGUF vocabularies (models/ggml-vocab-NAME.gguf) with test
inputs (NAME.gguf.inp: texts separated by "\\n__ggml_vocab_test__\\n") and the ids its
reference tokenizer gives for them (NAME.gguf.out: one line of space-separated ids per
text). llama.cpp's tests/test-tokenizer-0.cpp tokenizes every input with
add_special=false and parse_special=false: no BOS or EOS is added and special-token
texts are plain text. kiln's tok_encode never adds BOS, and `kilnd tokenize --hex`
without --special does not parse special texts, so the .out lines are compared as they
are. Every input of a vocabulary goes through one kilnd process (--hex reads one
hex-encoded text per line). Decoding is checked too: `kilnd detokenize --hex` of the
expected ids must give back the input's bytes (SentencePiece's added leading space is
dropped by kiln's detokenizer, as llama.cpp's is).

Usage: vocab_parity.py --kilnd build/gnu/kilnd (--vocabs DIR | --fetch tests/ref/vocabs.sh) [NAME ...]
  (no NAME: every vocabulary kiln handles, VOCABS below; --fetch: the script that puts
  the named vocabularies in a folder, downloading the sdist once, and prints the folder)
Prints one line per mismatch and per vocabulary "NAME: N of M identical"; exits 1 when
any input of a named vocabulary differs (--report: print only, always exit 0).
"""
import argparse
import os
import subprocess
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tok_parity import first_diff  # noqa: E402  (one copy)

# The vocabularies of the model families kiln serves (tokenizer.ggml.model / .pre):
VOCABS = [
    "llama-bpe",   # gpt2 / llama-bpe: Llama 3.x
    "qwen2",       # gpt2 / qwen2: Qwen2, Qwen2.5, Qwen3
    "qwen35",      # gpt2 / qwen35: Qwen3.5 (combining marks are letters)
    "llama-spm",   # llama (SentencePiece): Llama 2, Mistral v1-v3, Mixtral
    "phi-3",       # llama (SentencePiece): Phi-3
    "gpt-2",       # gpt2 / gpt-2
    "starcoder",   # gpt2 / starcoder: StarCoder, SmolLM-style digits
    "refact",      # gpt2 / refact: as starcoder
    "gemma-4",     # gemma4: BPE over '▁'-escaped text (Gemma 4)
]
SEP = b"\n__ggml_vocab_test__\n"


def read_tests(path):
    """The (text, ids) pairs, split as test-tokenizer-0.cpp splits them."""
    with open(path + ".inp", "rb") as f:
        raw = f.read()
    texts, pos = [], 0
    while pos < len(raw):
        nxt = raw.find(SEP, pos)
        if nxt < 0:
            texts.append(raw[pos:])
            break
        texts.append(raw[pos:nxt])
        pos = nxt + len(SEP)
    with open(path + ".out", encoding="ascii") as f:
        outs = [[int(x) for x in line.split()] for line in f.read().split("\n")[:len(texts)]]
    if len(outs) != len(texts):
        sys.exit("vocab_parity: %s: %d inputs but %d output lines" % (path, len(texts), len(outs)))
    return list(zip(texts, outs))


def kilnd_lines(kilnd, cmd, model, lines):
    p = subprocess.run([kilnd, cmd, "--model", model, "--hex"], input="".join(lines).encode(),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if p.returncode != 0:
        return None, "kilnd %s failed: %s" % (cmd, p.stderr.decode(errors="replace").strip())
    out = p.stdout.decode().split("\n")
    return [out[i] if i < len(out) else None for i in range(len(lines))], None


def kiln_ids(kilnd, model, texts):
    got, err = kilnd_lines(kilnd, "tokenize", model, [t.hex() + "\n" for t in texts])
    return ([[int(x) for x in g.split()] if g is not None else None for g in got] if got else None), err


def kiln_texts(kilnd, model, idss):
    got, err = kilnd_lines(kilnd, "detokenize", model, [" ".join(map(str, w)) + "\n" for w in idss])
    return ([bytes.fromhex(g) if g is not None else None for g in got] if got else None), err


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kilnd", required=True)
    ap.add_argument("--vocabs", help="folder with ggml-vocab-NAME.gguf{,.inp,.out}")
    ap.add_argument("--fetch", help="script: NAME... -> prints the folder holding them")
    ap.add_argument("--report", action="store_true", help="print the counts, never fail")
    ap.add_argument("names", nargs="*")
    args = ap.parse_args()
    names = args.names or VOCABS
    folder = args.vocabs
    if args.fetch:
        p = subprocess.run([args.fetch] + names, stdout=subprocess.PIPE)
        if p.returncode != 0:
            sys.exit("vocab_parity: %s failed (%d)" % (args.fetch, p.returncode))
        folder = p.stdout.decode().strip().split("\n")[-1]
    if not folder:
        sys.exit("vocab_parity: --vocabs or --fetch is required")
    bad = 0
    for name in names:
        path = os.path.join(folder, "ggml-vocab-%s.gguf" % name)
        tests = read_tests(path)
        got, err = kiln_ids(args.kilnd, path, [t for t, _ in tests])
        back, err2 = kiln_texts(args.kilnd, path, [w for _, w in tests])
        if got is None or back is None:
            print("%s: %s" % (name, err or err2))
            print("%s: 0 of %d identical" % (name, len(tests)))
            bad += 1
            continue
        same = 0
        for (text, want), ids, dec in zip(tests, got, back):
            show = text[:50].decode("utf-8", "replace")
            ok = True
            if ids != want:
                k = first_diff(ids or [], want)
                print("%s: %r: encode differs at %d: kiln %s, llama.cpp %s" %
                      (name, show, k, (ids or [])[k:k + 6], want[k:k + 6]))
                ok = False
            if dec != text:
                k = first_diff(dec or b"", text)
                print("%s: %r: decode differs at byte %d: kiln %r" % (name, show, k, (dec or b"")[k:k + 12]))
                ok = False
            same += ok
        print("%s: %d of %d identical (encode and decode)" % (name, same, len(tests)))
        bad += same != len(tests)
    return 0 if args.report or not bad else 1


if __name__ == "__main__":
    sys.exit(main())
