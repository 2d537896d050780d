#!/usr/bin/env python3
"""Cross-check vectors for core/cpu/quant.c, made with gguf's NumPy quants (an independent
implementation of ggml's block formats).

Writes build/quant_vectors.bin (or the path given); tests/unit/test_quant.c checks against
it ($QUANT_VECTORS, else build/quant_vectors.bin) and fails when it is missing:
  dequant records: random raw blocks of a type -> gguf's dequantized floats
  quantize records: random floats -> gguf's quantized bytes (types gguf can quantize)
Record: u32 kind (0 dequant, 1 quantize), u32 type, u32 n, u32 nbytes, then
dequant: bytes[nbytes] f32[n]; quantize: f32[n] bytes[nbytes].
Run: build/venv/bin/python tests/ref/quant_vectors.py [out]"""
import struct
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize, quantize

rng = np.random.default_rng(1234)

# byte offsets of f16 scale fields, set to sane finite values in random blocks
F16_FIELDS = {T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
              T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208]}


def random_blocks(t, nblk):
    bs, ts = GGML_QUANT_SIZES[t]
    if t in (T.F16, T.BF16, T.F32):
        x = (rng.standard_normal(nblk) * 3).astype(np.float32)
        return quantize(x, t).view(np.uint8).reshape(-1)
    raw = rng.integers(0, 256, size=(nblk, ts), dtype=np.uint8)
    for off in F16_FIELDS[t]:
        h = (rng.standard_normal(nblk) * 0.05).astype(np.float16)
        raw[:, off:off + 2] = h.view(np.uint8).reshape(nblk, 2)
    return raw.reshape(-1)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "build/quant_vectors.bin"
    recs = []
    for t in [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0,
              T.Q4_K, T.Q5_K, T.Q6_K]:
        bs, ts = GGML_QUANT_SIZES[t]
        n = bs * (7 if bs > 1 else 7 * 32)
        raw = random_blocks(t, n // bs)
        f = dequantize(raw, t).astype(np.float32).reshape(-1)
        assert f.size == n
        recs.append(struct.pack("<4I", 0, int(t), n, raw.size) + raw.tobytes() + f.tobytes())
    for t in [T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]:
        n = 32 * 9
        x = rng.standard_normal(n).astype(np.float32)
        x[32:64] = 0.0                      # an all-zero block (d = 0 path)
        x[64:96] = np.abs(x[64:96]) + 0.5   # an all-positive block
        q = quantize(x.reshape(1, n), t).view(np.uint8).reshape(-1)
        recs.append(struct.pack("<4I", 1, int(t), n, q.size) + x.tobytes() + q.tobytes())
    # real rows from the default model, if it is there
    try:
        from gguf import GGUFReader
        rd = GGUFReader("models/SmolLM2-135M-Instruct.Q4_1.gguf")
        for t in rd.tensors:
            if t.name in ("token_embd.weight", "blk.0.attn_q.weight"):
                bs, ts = GGML_QUANT_SIZES[t.tensor_type]
                n = int(t.shape[0]) * 2  # first two rows (shape[0] is the row length)
                raw = np.asarray(t.data).view(np.uint8).reshape(-1)[: n // bs * ts].copy()
                f = dequantize(raw, t.tensor_type).astype(np.float32).reshape(-1)
                recs.append(struct.pack("<4I", 0, int(t.tensor_type), n, raw.size)
                            + raw.tobytes() + f.tobytes())
    except FileNotFoundError:
        pass
    with open(out, "wb") as fp:
        for r in recs:
            fp.write(r)
    print(f"wrote {len(recs)} records to {out}")


if __name__ == "__main__":
    main()
