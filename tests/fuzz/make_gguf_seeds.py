#!/usr/bin/env python3
"""Writes the seed corpus for tests/fuzz/fuzz_gguf.c: a few tiny GGUF files, valid and
malformed, built with struct only (no gguf package). Run from the repo root:

    python3 tests/fuzz/make_gguf_seeds.py [outdir]

The outputs are committed; rerun after changing this script."""
import os
import struct
import sys

# GGUF value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
# tensor types (ggml numbering)
T_F32, T_F16, T_Q4_0, T_Q4_1, T_Q8_0, T_Q4_K, T_Q6_K = 0, 1, 2, 3, 8, 12, 14
BLOCK = {T_F32: (1, 4), T_F16: (1, 2), T_Q4_0: (32, 18), T_Q4_1: (32, 20), T_Q8_0: (32, 34),
         T_Q4_K: (256, 144), T_Q6_K: (256, 210)}


def s(text):
    b = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(b)) + b


def scalar(t, v):
    fmt = {U8: "B", I8: "b", U16: "H", I16: "h", U32: "I", I32: "i", F32: "f", BOOL: "?",
           U64: "Q", I64: "q", F64: "d"}[t]
    return struct.pack("<" + fmt, v)


def value(t, v):
    if t == STR:
        return s(v)
    if t == ARR:
        et, items = v
        return struct.pack("<IQ", et, len(items)) + b"".join(value(et, x) for x in items)
    return scalar(t, v)


def kv(key, t, v):
    return s(key) + struct.pack("<I", t) + value(t, v)


def tensor_size(ttype, ne):
    block, nbytes = BLOCK[ttype]
    rows = 1
    for n in ne[1:]:
        rows *= n
    return ne[0] // block * nbytes * rows


def gguf(kvs, tensors, version=3, align=32, magic=b"GGUF", n_tensors=None, n_kv=None, tail=0):
    """kvs: list of encoded kv entries; tensors: list of (name, ne, type, offset)."""
    out = magic + struct.pack("<IQQ", version,
                              len(tensors) if n_tensors is None else n_tensors,
                              len(kvs) if n_kv is None else n_kv)
    out += b"".join(kvs)
    end = 0
    for name, ne, ttype, off in tensors:
        out += s(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", n) for n in ne)
        out += struct.pack("<IQ", ttype, off)
        if ttype in BLOCK:
            end = max(end, off + tensor_size(ttype, ne))
    out += b"\0" * (-len(out) % align)
    out += bytes((i * 37 + 11) & 0xFF for i in range(end + tail))
    return out


def base_kvs():
    return [
        kv("general.architecture", STR, "llama"),
        kv("general.alignment", U32, 32),
        kv("llama.block_count", U32, 1),
        kv("llama.embedding_length", U32, 32),
        kv("llama.rope.freq_base", F32, 10000.0),
        kv("tokenizer.ggml.add_bos_token", BOOL, True),
        kv("tokenizer.ggml.model", STR, "gpt2"),
        kv("tokenizer.ggml.tokens", ARR, (STR, ["<|endoftext|>", "a", "b", "\u0120t", "ab"])),
        kv("tokenizer.ggml.token_type", ARR, (I32, [3, 1, 1, 1, 1])),
        kv("tokenizer.ggml.scores", ARR, (F32, [0.0, -1.0, -2.0, -3.0, -4.0])),
        kv("tokenizer.ggml.merges", ARR, (STR, ["a b"])),
        kv("test.nested", ARR, (ARR, [(U8, [1, 2]), (I64, [-1])])),
        kv("test.f64", F64, 0.25),
    ]


BASE_TENSORS = [
    ("token_embd.weight", [32, 5], T_Q8_0, 0),       # 5 rows x 34 bytes = 170
    ("blk.0.attn_norm.weight", [32], T_F32, 192),    # 128 bytes
    ("blk.0.attn_q.weight", [32, 32], T_Q4_1, 320),  # 32 x 20 = 640
    ("output_norm.weight", [32], T_F32, 960),
]


def seeds():
    kvs = base_kvs()
    t = BASE_TENSORS
    yield "valid_small.gguf", gguf(kvs, t)
    yield "valid_v2.gguf", gguf(kvs, t, version=2)
    yield "valid_empty.gguf", gguf([], [])
    yield "valid_kv_only.gguf", gguf(kvs, [])
    yield "valid_align64.gguf", gguf([kv("general.alignment", U32, 64)],
                                     [("w", [64, 2], T_Q4_0, 0), ("v", [8], T_F16, 128)], align=64)
    yield "valid_k_quants.gguf", gguf([], [("q4k", [256], T_Q4_K, 0), ("q6k", [256], T_Q6_K, 160)])
    deep = (ARR, [(ARR, [(ARR, [(U8, [7])])])])
    yield "valid_nested4.gguf", gguf([kv("test.deep", ARR, deep)], [])
    # malformed
    yield "bad_magic.gguf", gguf(kvs, t, magic=b"GGUX")
    yield "bad_version1.gguf", gguf(kvs, t, version=1)
    yield "bad_huge_nkv.gguf", gguf(kvs, t, n_kv=1 << 62)
    yield "bad_huge_ntensors.gguf", gguf(kvs, t, n_tensors=1 << 62)
    yield "bad_truncated.gguf", gguf(kvs, t)[:-1]
    yield "bad_nested5.gguf", gguf([kv("test.deep", ARR, (ARR, [deep]))], [])
    yield "bad_unaligned.gguf", gguf(kvs, [("w", [32], T_F32, 4)], tail=8)
    yield "bad_overlap.gguf", gguf(kvs, [("a", [64], T_F32, 0), ("b", [32], T_F32, 128)])
    yield "bad_dup_name.gguf", gguf(kvs, [("a", [8], T_F32, 0), ("a", [8], T_F32, 32)])
    yield "bad_type.gguf", gguf(kvs, [("a", [8], 99, 0)], tail=32)
    yield "bad_align3.gguf", gguf([kv("general.alignment", U32, 3)], [])
    yield "bad_dup_key.gguf", gguf(kvs + [kv("llama.block_count", U32, 2)], [])
    yield "bad_strlen.gguf", gguf([s("k") + struct.pack("<IQ", STR, 1 << 63)], [])


def main():
    outdir = sys.argv[1] if len(sys.argv) > 1 else "tests/fuzz/corpus/fuzz_gguf"
    os.makedirs(outdir, exist_ok=True)
    for name, data in seeds():
        assert len(data) < 4096, (name, len(data))
        with open(os.path.join(outdir, name), "wb") as f:
            f.write(data)
        print(f"{name}: {len(data)} bytes")


if __name__ == "__main__":
    main()
