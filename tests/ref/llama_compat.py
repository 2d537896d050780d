#!/usr/bin/env python3
"""The form of a GGUF that llama.cpp's CPU backend can run, with the same math.

  llama_compat.py [--f32] MODEL.gguf OUTDIR
      prints "file PATH": what to give llama.cpp (MODEL itself, or OUTDIR/<name>.gguf,
      or with --f32 OUTDIR/<name>-f32.gguf), then "widen TENSOR: F16 -> F32" per tensor
      changed and "override KEY=VALUE" per metadata string llama_logits must override

tests/ref/make_tiny_models.py writes some 1-D tensors (norm vectors) as F16 or BF16 to
exercise kiln's widening of them.  llama.cpp multiplies by a norm with a ggml binary op
whose CPU kernels take an f32 second operand only: on tiny-qwen2.gguf (F16/BF16 norms)
llama_decode aborts with "binary_op: unsupported types: dst: f32, src0: f32, src1: f16"
(ggml-cpu/binary-ops.cpp; real GGUFs keep 1-D tensors in F32, so llama.cpp never meets
this).  Widening F16/BF16 to F32 is exact, so a copy with those tensors in F32 and
everything else byte for byte the same (metadata, tensor order, every other tensor's
bytes) computes the same function; kiln widens them to f32 at load itself.  That copy
is what record_logits.sh gives llama.cpp and what llama_parity.py runs kiln on (its
sha256 recorded and checked as the original's is).

The pre-tokenizer name: make_tiny_models.py writes tokenizer.ggml.pre = "gpt2", which
llama.cpp spells "gpt-2" and refuses otherwise ("unknown pre-tokenizer type: 'gpt2'" at
load).  The pre-tokenizer only splits text, and these references are computed from token
ids, so it cannot change a logit; it is overridden at load (llama_model_kv_override), not
rewritten, so the file stays the same.  So is general.name where llama.cpp reads meaning
into it (a "phi3" name: see overrides()).

When a model needs no tensor change, MODEL itself is printed and nothing is written.

The f32 twin (--f32): every tensor that is not F32 dequantized (gguf.quants) to F32, the
rest as above.  It computes the model's function with exactly the same weights, but
llama.cpp then runs every matmul in f32: its CPU matmuls otherwise round the activations
to the weight type's dot type (Q8_K for the K-quants, one scale per 256 values, i.e. per
whole row of a d=256 model; Q8_0/Q8_1 for the 32-blocks; F16 or BF16 for those weights),
and on tiny-llama-kquants that moves its logits by up to ~0.4 from the f32 function,
which blurs top-1 at most positions.  On the twin only its f16 KV cache and attention
remain, and kiln --exact agrees with it to KL ~1e-6: the twin is where llama.cpp checks
the structure (RoPE pairing, GQA, biases, norms) tightly; the model itself is where it
checks kiln's quant decoding against llama.cpp's own.  The copy
is deterministic (the same gguf package writes the same bytes) and checked after writing:
every tensor read back equal to the original's values.
"""
import os
import sys

import numpy as np

try:
    import gguf
    from gguf import GGMLQuantizationType as QT
    from gguf.quants import dequantize
except ImportError:  # pragma: no cover
    sys.stderr.write("llama_compat: needs the 'gguf' package (tests/requirements.txt)\n")
    raise

WIDEN = (QT.F16, QT.BF16)
# tokenizer.ggml.pre names kiln's files use -> llama.cpp's name for the same pre-tokenizer
PRE_ALIASES = {"gpt2": "gpt-2"}


def _values(t):
    """A tensor's values as float32 in numpy order (quantized types dequantized by
    gguf.quants, the NumPy reference's decoder)."""
    if t.tensor_type == QT.F32:
        return np.asarray(t.data, dtype=np.float32)
    if t.tensor_type == QT.F16:
        return np.asarray(t.data, dtype=np.float16).astype(np.float32)
    return dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32)


def changes(reader, variant="compat"):
    """[(tensor name, what is done)] for this model: empty when llama.cpp takes it as is.
    variant "compat": the 1-D F16/BF16 tensors widened (the model's own math);
    "f32": every tensor that is not F32 widened or dequantized to F32 (see f32_twin)."""
    if variant == "f32":
        return [(t.name, f"{t.tensor_type.name} -> F32") for t in reader.tensors
                if t.tensor_type != QT.F32]
    return [(t.name, f"{t.tensor_type.name} -> F32") for t in reader.tensors
            if len(t.shape) == 1 and t.tensor_type in WIDEN]


def overrides(reader):
    """["KEY=VALUE"] for llama_logits --override."""
    f = reader.fields.get("tokenizer.ggml.pre")
    pre = f.contents() if f is not None else None
    out = [f"tokenizer.ggml.pre={PRE_ALIASES[pre]}"] if pre in PRE_ALIASES else []
    # llama.cpp sets special-token attributes by general.name: a name containing "phi3"
    # makes it look up "</s>", which these vocabularies lack ("unordered_map::at" at
    # load). The name is a label, never part of the math.
    f = reader.fields.get("general.name")
    name = f.contents() if f is not None else ""
    if "phi3" in name.lower() or "phi-3" in name.lower():
        out.append("general.name=kiln tiny model")
    return out


def write_copy(path, out, variant="compat"):
    """Writes the copy of path to out (via out.tmp); returns the changes."""
    r = gguf.GGUFReader(path)
    todo = dict(changes(r, variant))
    arch = r.fields["general.architecture"].contents()
    align = r.fields["general.alignment"].contents() if "general.alignment" in r.fields else None
    tmp = out + ".tmp"
    w = gguf.GGUFWriter(tmp, arch, **({"alignment": align} if align else {}))
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.alignment"):
            continue
        vt = f.types[0]
        sub = f.types[1] if vt == gguf.GGUFValueType.ARRAY else None
        if vt == gguf.GGUFValueType.ARRAY and len(f.types) > 2:
            raise ValueError(f"{path}: {key}: nested arrays are not copied")
        w.add_key_value(key, f.contents(), vt, sub_type=sub)
    for t in r.tensors:
        if t.name in todo:
            w.add_tensor(t.name, _values(t))
        elif t.tensor_type in (QT.F32, QT.F16):
            w.add_tensor(t.name, np.asarray(t.data))
        else:
            w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    _check(r, gguf.GGUFReader(tmp), todo)
    os.replace(tmp, out)
    return list(todo.items())


def _check(a, b, todo):
    """b has a's metadata and tensors (values for the widened ones, bytes for the rest)."""
    fa = {k: f.contents() for k, f in a.fields.items() if not k.startswith("GGUF.")}
    fb = {k: f.contents() for k, f in b.fields.items() if not k.startswith("GGUF.")}
    if fa != fb:
        keys = sorted(k for k in fa.keys() | fb.keys() if fa.get(k) != fb.get(k))
        raise AssertionError(f"metadata differs after copying: {', '.join(keys[:5])}")
    if [t.name for t in a.tensors] != [t.name for t in b.tensors]:
        raise AssertionError("tensor list differs after copying")
    for ta, tb in zip(a.tensors, b.tensors):
        if list(ta.shape) != list(tb.shape):
            raise AssertionError(f"{ta.name}: shape {ta.shape} -> {tb.shape}")
        if ta.name in todo:
            if tb.tensor_type != QT.F32 or not np.array_equal(_values(ta), _values(tb)):
                raise AssertionError(f"{ta.name}: values differ after widening")
        elif ta.tensor_type != tb.tensor_type or \
                np.asarray(ta.data).tobytes() != np.asarray(tb.data).tobytes():
            raise AssertionError(f"{ta.name}: bytes differ after copying")


def compat_path(path, outdir, variant="compat"):
    """The file llama.cpp runs for path: path itself, or the copy in outdir (written, or
    rewritten, here): OUTDIR/<name>.gguf, or OUTDIR/<name>-f32.gguf for the f32 twin.
    Returns (file, changes)."""
    todo = changes(gguf.GGUFReader(path), variant)
    if not todo:
        return path, []
    os.makedirs(outdir, exist_ok=True)
    base = os.path.basename(path)
    if variant == "f32":
        base = base[:-len(".gguf")] + "-f32.gguf" if base.endswith(".gguf") else base + "-f32"
    out = os.path.join(outdir, base)
    return out, write_copy(path, out, variant)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    variant = "compat"
    if argv[:1] == ["--f32"]:
        variant, argv = "f32", argv[1:]
    if len(argv) != 2 or argv[0].startswith("-"):
        sys.stderr.write("usage: llama_compat.py [--f32] MODEL.gguf OUTDIR\n")
        return 2
    try:
        out, todo = compat_path(argv[0], argv[1], variant)
    except (OSError, ValueError, AssertionError) as e:
        sys.stderr.write(f"llama_compat: {argv[0]}: {e}\n")
        return 1
    print(f"file {out}")
    for name, what in todo:
        print(f"widen {name}: {what}")
    for kv in overrides(gguf.GGUFReader(argv[0])):
        print(f"override {kv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
