#!/usr/bin/env python3
"""Random-weight F16 GGUF models of real models' shapes, for benchmarks.

  gen_shape.py SHAPE OUT.gguf [--tokenizer MODEL.gguf] [--seed N]
  gen_shape.py --list

The cost of a forward pass depends on the shape, not on the weights, so a model with
seeded random weights (normal, std 0.02 for the matrices; norms 1 + 0.02 * normal) of
exactly a published model's dimensions measures what that model would.  The file is
F16 throughout except the 1-D tensors (norms, biases), which are F32 the way llama.cpp's
converter writes them; llama-quantize turns it into the formats users download.

Tokenizer: every tokenizer.* key of the default model (byte-level BPE, vocab 49152,
ChatML template) is copied, and the vocabulary is padded to the shape's real size with
unique control tokens <|reserved_N|>, so token_embd.weight / output.weight have the real
model's size.  Llama 3.1/3.2 shapes carry the rope_freqs tensor their converter writes
(from the published rope_scaling "llama3" parameters); Qwen3 shapes have per-head q/k norms;
mixture-of-experts shapes an F32 router and 3-D expert tensors; Gemma 3 its q/k norms,
post-norms and sliding-window keys.

Metadata written: what core/model.c read_config reads ({arch}.block_count,
embedding_length, attention.head_count, attention.head_count_kv, feed_forward_length,
context_length, rope.dimension_count, rope.freq_base, attention.layer_norm_rms_epsilon)
and the tensors it loads (token_embd, blk.N.{attn_norm, attn_q, attn_k, attn_v,
attn_output, ffn_norm, ffn_gate, ffn_up, ffn_down}, the qwen2 q/k/v biases, output_norm,
output unless tied), plus general.file_type and {arch}.vocab_size for llama.cpp.

Tensors are written one at a time after the header (GGUFWriter.add_tensor_info, then
write_tensor_data per tensor), so memory holds one tensor, not the model (the 8B F16
is 15 GB).
"""
import argparse
import os
import sys
import time
import zlib

import numpy as np

try:
    import gguf
    from gguf import GGUFValueType as VT
except ImportError:  # pragma: no cover
    sys.stderr.write("gen_shape: needs the 'gguf' package (tests/requirements.txt)\n")
    raise

# Published configurations (config.json of each model); head_dim = d / heads unless hd.
# llama3_rope: rope_scaling "llama3" (factor, low_freq_factor, high_freq_factor,
# original_max_position_embeddings). experts: (count, used, expert ffn).
SHAPES = {
    "llama-3.2-1b": dict(arch="llama", d=2048, layers=16, heads=32, kv=8, ffn=8192,
                         vocab=128256, tied=True, theta=500000.0, eps=1e-5, ctx=131072,
                         llama3_rope=(32.0, 1.0, 4.0, 8192)),
    "llama-3.2-3b": dict(arch="llama", d=3072, layers=28, heads=24, kv=8, ffn=8192,
                         vocab=128256, tied=True, theta=500000.0, eps=1e-5, ctx=131072,
                         llama3_rope=(32.0, 1.0, 4.0, 8192)),
    "llama-3.1-8b": dict(arch="llama", d=4096, layers=32, heads=32, kv=8, ffn=14336,
                         vocab=128256, tied=False, theta=500000.0, eps=1e-5, ctx=131072,
                         llama3_rope=(8.0, 1.0, 4.0, 8192)),
    "qwen3-0.6b": dict(arch="qwen3", d=1024, layers=28, heads=16, kv=8, hd=128, ffn=3072,
                       vocab=151936, tied=True, theta=1e6, eps=1e-6, ctx=40960),
    "qwen3-8b": dict(arch="qwen3", d=4096, layers=36, heads=32, kv=8, hd=128, ffn=12288,
                     vocab=151936, tied=False, theta=1e6, eps=1e-6, ctx=40960),
    # Qwen3-30B-A3B with 32 of its 128 experts: the same 8 active per token, so the same
    # bytes per decoded token (~3.3B active parameters), in a file a 24 GB machine holds.
    "qwen3-30b-a3b-e32": dict(arch="qwen3moe", d=2048, layers=48, heads=32, kv=4, hd=128,
                              ffn=6144, experts=(32, 8, 768), vocab=151936, tied=False,
                              theta=1e6, eps=1e-6, ctx=40960),
    "qwen2.5-1.5b": dict(arch="qwen2", d=1536, layers=28, heads=12, kv=2, ffn=8960,
                         vocab=151936, tied=True, bias=True, theta=1e6, eps=1e-6, ctx=32768),
    "qwen2.5-7b": dict(arch="qwen2", d=3584, layers=28, heads=28, kv=4, ffn=18944,
                       vocab=152064, tied=False, bias=True, theta=1e6, eps=1e-6, ctx=32768),
    # Gemma 3 1B: 5 of every 6 layers see the last 512 positions (their RoPE base 10000),
    # per-head q/k norms, post-norms, GeGLU; swa: (window, pattern, local RoPE base).
    "gemma3-1b": dict(arch="gemma3", d=1152, layers=26, heads=4, kv=1, hd=256, ffn=6912,
                      vocab=262144, tied=True, theta=1e6, eps=1e-6, ctx=32768,
                      swa=(512, 6, 10000.0)),
}

DEFAULT_TOKENIZER = "models/SmolLM2-135M-Instruct.Q4_1.gguf"
TOKEN_CONTROL = 3  # llama.cpp's LLAMA_TOKEN_TYPE_CONTROL
CHUNK = 1 << 24    # elements generated per numpy call (64 MB of float32)


# ---------------------------------------------------------------------------- tensors

def tensor_plan(s):
    """[(name, shape, kind)] in file order; kind: mat (F16) or norm/bias/f32 (F32)."""
    d, hd = s["d"], s.get("hd", s["d"] // s["heads"])
    qd, kd, f, v = s["heads"] * hd, s["kv"] * hd, s["ffn"], s["vocab"]
    plan = [("token_embd.weight", (v, d), "mat")]
    for l in range(s["layers"]):
        b = f"blk.{l}."
        plan += [(b + "attn_norm.weight", (d,), "norm"),
                 (b + "attn_q.weight", (qd, d), "mat"),
                 (b + "attn_k.weight", (kd, d), "mat"),
                 (b + "attn_v.weight", (kd, d), "mat")]
        if s.get("bias"):
            plan += [(b + "attn_q.bias", (qd,), "bias"),
                     (b + "attn_k.bias", (kd,), "bias"),
                     (b + "attn_v.bias", (kd,), "bias")]
        if s["arch"].startswith("qwen3") or s["arch"] == "gemma3":
            plan += [(b + "attn_q_norm.weight", (hd,), "norm"),
                     (b + "attn_k_norm.weight", (hd,), "norm")]
        plan += [(b + "attn_output.weight", (d, qd), "mat")]
        if s["arch"] == "gemma3":
            plan += [(b + "post_attention_norm.weight", (d,), "norm")]
        plan += [(b + "ffn_norm.weight", (d,), "norm")]
        if "experts" in s:
            ne, _, fe = s["experts"]
            plan += [(b + "ffn_gate_inp.weight", (ne, d), "f32"),
                     (b + "ffn_gate_exps.weight", (ne, fe, d), "mat"),
                     (b + "ffn_up_exps.weight", (ne, fe, d), "mat"),
                     (b + "ffn_down_exps.weight", (ne, d, fe), "mat")]
        else:
            plan += [(b + "ffn_gate.weight", (f, d), "mat"),
                     (b + "ffn_up.weight", (f, d), "mat"),
                     (b + "ffn_down.weight", (d, f), "mat")]
        if s["arch"] == "gemma3":
            plan += [(b + "post_ffw_norm.weight", (d,), "norm")]
    plan.append(("output_norm.weight", (d,), "norm"))
    if not s["tied"]:
        plan.append(("output.weight", (v, d), "mat"))
    if "llama3_rope" in s:
        plan.append(("rope_freqs.weight", (hd // 2,), "ropefreqs"))
    return plan


def llama3_rope_factors(hd, theta, factor, low, high, old_ctx):
    """Llama 3.1's per-pair RoPE divisors, as its rope_scaling "llama3" defines them."""
    out = np.empty(hd // 2, np.float32)
    for i in range(hd // 2):
        wavelen = 2 * np.pi / theta ** (-2 * i / hd)
        if wavelen < old_ctx / high:
            out[i] = 1.0
        elif wavelen > old_ctx / low:
            out[i] = factor
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out[i] = 1.0 / ((1 - smooth) / factor + smooth)
    return out


def make_tensor(name, shape, kind, seed, s=None):
    """Seeded per tensor name, so a tensor does not depend on what was written before."""
    if kind == "ropefreqs":
        hd = s.get("hd", s["d"] // s["heads"])
        return llama3_rope_factors(hd, s["theta"], *s["llama3_rope"])
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    n = int(np.prod(shape))
    out = np.empty(n, np.float16 if kind == "mat" else np.float32)
    buf = np.empty(min(n, CHUNK), np.float32)
    for i in range(0, n, CHUNK):
        k = min(CHUNK, n - i)
        rng.standard_normal(out=buf[:k], dtype=np.float32)
        buf[:k] *= 0.02
        if kind == "norm":
            buf[:k] += 1.0
        out[i:i + k] = buf[:k]
    return out.reshape(shape)


# ---------------------------------------------------------------------------- tokenizer

def field_value(f):
    """A GGUFReader field as (value, type, sub_type) for GGUFWriter.add_key_value."""
    t = f.types[0]
    if t == VT.ARRAY:
        sub = f.types[-1]
        if sub == VT.STRING:
            return [bytes(f.parts[i]) for i in f.data], t, sub
        return list(f.contents()), t, sub
    if t == VT.STRING:
        return bytes(f.parts[f.data[0]]), t, None
    return f.contents(), t, None


def copy_tokenizer(w, path, n_vocab):
    r = gguf.GGUFReader(path)
    kv = {k: field_value(f) for k, f in r.fields.items() if k.startswith("tokenizer.")}
    toks = kv["tokenizer.ggml.tokens"][0]
    n_src = len(toks)
    if n_src > n_vocab:
        sys.exit(f"gen_shape: tokenizer of {path} has {n_src} tokens, more than {n_vocab}")
    have = set(toks)
    pad = [f"<|reserved_{i}|>".encode() for i in range(n_vocab - n_src)]
    if have.intersection(pad):
        sys.exit("gen_shape: a padding token name is already in the vocabulary")
    kv["tokenizer.ggml.tokens"] = (toks + pad, VT.ARRAY, VT.STRING)
    if "tokenizer.ggml.token_type" in kv:
        v, t, sub = kv["tokenizer.ggml.token_type"]
        kv["tokenizer.ggml.token_type"] = (v + [TOKEN_CONTROL] * len(pad), t, sub)
    if "tokenizer.ggml.scores" in kv:
        v, t, sub = kv["tokenizer.ggml.scores"]
        kv["tokenizer.ggml.scores"] = (v + [0.0] * len(pad), t, sub)
    for k, (v, t, sub) in kv.items():
        w.add_key_value(k, v, t, sub)
    return n_src


# ---------------------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shape", nargs="?")
    ap.add_argument("out", nargs="?")
    ap.add_argument("--tokenizer", default=DEFAULT_TOKENIZER)
    ap.add_argument("--seed", type=int, default=20241202)
    ap.add_argument("--list", action="store_true", help="print the known shapes")
    a = ap.parse_args()
    if a.list:
        for k, s in SHAPES.items():
            print(k, " ".join(f"{x}={y}" for x, y in s.items()))
        return
    if a.shape not in SHAPES or not a.out:
        ap.error(f"need SHAPE OUT; shapes: {', '.join(SHAPES)}")
    s = SHAPES[a.shape]
    arch, hd = s["arch"], s.get("hd", s["d"] // s["heads"])

    tmp = a.out + ".part"
    w = gguf.GGUFWriter(tmp, arch)
    w.add_type("model")
    w.add_name(f"random {a.shape} (shape only)")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_context_length(s["ctx"])
    w.add_embedding_length(s["d"])
    w.add_block_count(s["layers"])
    w.add_feed_forward_length(s["ffn"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv"])
    w.add_rope_dimension_count(hd)
    if hd * s["heads"] != s["d"]:
        w.add_key_length(hd)
        w.add_value_length(hd)
    if "experts" in s:
        ne, nu, fe = s["experts"]
        w.add_expert_count(ne)
        w.add_expert_used_count(nu)
        w.add_expert_feed_forward_length(fe)
    w.add_rope_freq_base(s["theta"])
    if "swa" in s:
        win, pattern, base = s["swa"]
        w.add_uint32(f"{arch}.attention.sliding_window", win)
        w.add_uint32(f"{arch}.attention.sliding_window_pattern", pattern)
        w.add_float32(f"{arch}.rope.freq_base_swa", base)
    w.add_layer_norm_rms_eps(s["eps"])
    w.add_vocab_size(s["vocab"])
    n_src = copy_tokenizer(w, a.tokenizer, s["vocab"])

    plan = tensor_plan(s)
    for name, shape, kind in plan:
        dt = np.dtype(np.float16 if kind == "mat" else np.float32)
        w.add_tensor_info(name, shape, dt, int(np.prod(shape)) * dt.itemsize)
    total = sum(int(np.prod(sh)) * (2 if k == "mat" else 4) for _, sh, k in plan)
    sys.stderr.write(f"gen_shape: {a.shape}: {len(plan)} tensors, {total / 2**30:.2f} GiB, "
                     f"vocab {n_src} + {s['vocab'] - n_src} reserved -> {a.out}\n")
    t0 = time.monotonic()
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    done = 0
    for i, (name, shape, kind) in enumerate(plan):
        x = make_tensor(name, shape, kind, a.seed, s)
        w.write_tensor_data(x)
        done += x.nbytes
        del x
        if "ffn_down" in name or i == len(plan) - 1:
            sys.stderr.write(f"\rgen_shape: {done / 2**30:6.2f} / {total / 2**30:.2f} GiB")
    w.close()
    os.replace(tmp, a.out)
    sys.stderr.write(f"\ngen_shape: wrote {a.out} in {time.monotonic() - t0:.0f} s\n")


if __name__ == "__main__":
    main()
