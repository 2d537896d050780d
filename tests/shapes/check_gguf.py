#!/usr/bin/env python3
"""check_gguf.py FILE PLAN VOCAB: an independent reader (gguf-py) opens a file `kilnd
shape` wrote and finds what the plan says: the same tensors in order with their types
and dims, data inside the file at the right sizes, the token list (and its types) of
VOCAB entries, the padding tokens named <|reserved_N|> and typed control. Exit 1 on a
mismatch."""
import sys

import gguf

path, plan_path, vocab = sys.argv[1], sys.argv[2], int(sys.argv[3])
r = gguf.GGUFReader(path)
plan = [l.split() for l in open(plan_path) if l.strip()]
bad = []
if len(r.tensors) != len(plan):
    bad.append(f"{len(r.tensors)} tensors, the plan has {len(plan)}")
for t, p in zip(r.tensors, plan):
    dims = [int(x) for x in p[2:]]
    if t.name != p[0] or t.tensor_type.name != p[1] or [int(x) for x in t.shape] != dims:
        bad.append(f"tensor {t.name} {t.tensor_type.name} {list(t.shape)}: plan {p}")
    n = 1
    for d in dims:
        n *= d
    if t.n_elements != n or t.data_offset + t.n_bytes > r.data.size:
        bad.append(f"tensor {t.name}: {t.n_elements} elements, {t.n_bytes} bytes at {t.data_offset}")
toks = r.fields["tokenizer.ggml.tokens"]
types = r.fields["tokenizer.ggml.token_type"]
if len(toks.data) != vocab or len(types.data) != vocab:
    bad.append(f"{len(toks.data)} tokens, {len(types.data)} token types; want {vocab}")
last = bytes(toks.parts[toks.data[-1]]).decode()
if vocab > 49152 and (not last.startswith("<|reserved_") or int(types.parts[types.data[-1]][0]) != 3):
    bad.append(f"the last token is {last!r}, not a control <|reserved_N|>")
arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
if int(r.fields[f"{arch}.vocab_size"].parts[-1][0]) != vocab:
    bad.append(f"{arch}.vocab_size is not {vocab}")
for b in bad[:20]:
    print("FAIL", b)
print(f"check_gguf: {path}: {len(r.tensors)} tensors, {len(toks.data)} tokens: "
      f"{'ok' if not bad else f'{len(bad)} problems'}")
sys.exit(1 if bad else 0)
