#!/usr/bin/env python3
"""Bytes of weights one single-stream decode token reads, from a GGUF's tensor table.

  decode_bytes.py MODEL.gguf
  -> decode_bytes=N tensor_bytes=T tied=0|1

Every tensor is read once per token (each layer's matrices, norms and biases, the final
norm, the output matrix) except token_embd.weight, of which a token reads one row; when
there is no output.weight the output matrix is token_embd itself (tied) and it counts.
"""
import sys

import gguf


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: decode_bytes.py MODEL.gguf")
    r = gguf.GGUFReader(sys.argv[1])
    sizes = {t.name: int(t.n_bytes) for t in r.tensors}
    total = sum(sizes.values())
    tied = "output.weight" not in sizes
    read = total - (0 if tied else sizes.get("token_embd.weight", 0))
    print(f"decode_bytes={read} tensor_bytes={total} tied={int(tied)}")


if __name__ == "__main__":
    main()
