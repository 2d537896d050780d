#!/usr/bin/env python3
"""Bytes of weights one single-stream decode token reads, from a GGUF's tensor table.

  decode_bytes.py MODEL.gguf
  -> decode_bytes=N tensor_bytes=T tied=0|1

Every tensor is read once per token (each layer's matrices, norms and biases, the final
norm, the output matrix) except token_embd.weight, of which a token reads one row; when
there is no output.weight the output matrix is token_embd itself (tied) and it counts.
A mixture of experts' 3-D expert tensors (*_exps.weight) count expert_used_count of
their expert_count experts: what one token's chosen experts read.
"""
import sys

import gguf


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: decode_bytes.py MODEL.gguf")
    r = gguf.GGUFReader(sys.argv[1])
    sizes = {t.name: int(t.n_bytes) for t in r.tensors}
    arch = r.fields["general.architecture"].contents()
    ne = r.fields.get(f"{arch}.expert_count")
    nu = r.fields.get(f"{arch}.expert_used_count")
    if ne is not None and nu is not None and int(ne.contents()) > 0:
        frac = int(nu.contents()) / int(ne.contents())
        sizes = {n: int(b * frac) if n.endswith("_exps.weight") else b for n, b in sizes.items()}
    total = sum(int(t.n_bytes) for t in r.tensors)
    tied = "output.weight" not in sizes
    read = sum(sizes.values()) - (0 if tied else sizes.get("token_embd.weight", 0))
    print(f"decode_bytes={read} tensor_bytes={total} tied={int(tied)}")


if __name__ == "__main__":
    main()
