#!/usr/bin/env python3
"""cut_model.py SRC DST --layers N: a GGUF of SRC's first N layers, every other tensor
and all metadata kept (block_count set to N), tensors byte for byte as in SRC.

Why: the GPU machine is reached through a 64 MiB transfer and the default model is 94
MiB; the GPU tests compare the two backends on the same file, which a 12-layer cut of
the real model serves as well as the whole (every kernel and shape is the same)."""
import argparse
import sys

import gguf


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--layers", type=int, required=True)
    a = ap.parse_args()
    r = gguf.GGUFReader(a.src)
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    w = gguf.GGUFWriter(a.dst, arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vt = f.types[0]
        if name == f"{arch}.block_count":
            w.add_uint32(name, a.layers)
        elif vt == gguf.GGUFValueType.ARRAY:
            sub = f.types[-1]
            if sub == gguf.GGUFValueType.STRING:
                vals = [bytes(f.parts[i]).decode("utf-8", "surrogateescape") for i in f.data]
            else:
                vals = [f.parts[i].tolist()[0] for i in f.data]
            w.add_array(name, vals)
        elif vt == gguf.GGUFValueType.STRING:
            w.add_string(name, bytes(f.parts[-1]).decode("utf-8", "surrogateescape"))
        else:
            w.add_key_value(name, f.parts[-1].tolist()[0], vt)
    kept = 0
    for t in r.tensors:
        if t.name.startswith("blk.") and int(t.name.split(".")[1]) >= a.layers:
            continue
        # t.data is the bytes' numpy view; the writer derives the element shape from
        # it and the type
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
        kept += 1
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"cut_model: {a.dst}: {kept} tensors, {a.layers} layers", file=sys.stderr)


if __name__ == "__main__":
    main()
