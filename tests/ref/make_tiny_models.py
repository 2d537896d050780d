#!/usr/bin/env python3
"""Small random GGUF models that exercise what the default model does not.

  make_tiny_models.py OUTDIR      writes OUTDIR/tiny-*.gguf, one per entry of MODELS
                                  (deterministic; a few seconds)

tiny-llama-kquants.gguf  arch "llama" (adjacent-pair RoPE), 2 layers, d 256,
    4 heads / 2 KV heads (GQA) of 64, ffn 512, vocab 512, tied embeddings
    (token_embd in Q6_K, no output.weight), F32 norms, no biases; the matrices
    rotate through Q4_K, Q5_K, Q6_K, Q8_0, Q5_1 so that every type appears in
    the q/k/v, o, gate/up and down positions across the two layers.
tiny-qwen2.gguf  arch "qwen2" (NeoX RoPE, freq_base 1e6), 2 layers, d 192,
    6 heads / 2 KV heads (group 3) of 32, ffn 512, vocab 512, F32 q/k/v biases,
    a separate output.weight (F16), token_embd in BF16, F16/BF16 norm vectors;
    the matrices are Q4_0, Q5_0, F16, BF16 and F32 (F32 on k/v only, for size).
tiny-llama3.gguf, tiny-qwen3.gguf, tiny-granite.gguf  the families' own math: Llama
    3.1+ rope_freqs, Qwen3's q/k norms and YaRN, Granite's multipliers (see MODELS).

gguf.quants (the installed gguf package) can dequantize but not quantize the
K-quants (Q4_K, Q5_K, Q6_K raise NotImplementedError), so this file packs those
three itself, from the block layouts of the GGUF format, with a plain
round-to-nearest quantizer.  Every packed matrix is checked by dequantizing it
with gguf.quants.dequantize (the decoder the NumPy reference uses) and
comparing with the original floats, so a packing mistake here fails loudly
instead of showing up as a kilnd "mismatch".

Tokenizer: a GPT-2 byte-level BPE vocab: the 256 byte characters, 254 merges
learned (a few lines of BPE training) from a fixed English paragraph, then the
control tokens <|endoftext|> (bos = eos, id 510) and <|im_end|> (511).
"""
import os
import re
import sys
import time
from collections import Counter

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ref_llama import bytes_to_unicode  # noqa: E402  (GPT-2 byte table, one copy)

try:
    import gguf
    from gguf import GGMLQuantizationType as QT
    from gguf.quants import dequantize, quantize
except ImportError:  # pragma: no cover
    sys.stderr.write("make_tiny_models: needs the 'gguf' package (tests/requirements.txt)\n")
    raise

N_VOCAB = 512
SEED = 20240611

# ---------------------------------------------------------------------------- K-quants
# Block layouts (GGUF / ggml, QK_K = 256 elements per super-block):
#   Q4_K 144 B: d f16, dmin f16, scales[12] (8 six-bit scales + 8 six-bit mins),
#               qs[128] (4-bit);  w = d*sc[j]*q - dmin*m[j], 8 sub-blocks of 32
#   Q5_K 176 B: d, dmin, scales[12], qh[32] (5th bits), qs[128]
#   Q6_K 210 B: ql[128] (low 4 bits), qh[64] (high 2 bits), scales[16] (int8),
#               d f16;  w = d*sc[j]*(q - 32), 16 sub-blocks of 16
# 6-bit scale packing (Q4_K/Q5_K): sub-block j < 4: sc in scales[j] & 63,
# min in scales[j+4] & 63; j >= 4: low 4 bits of sc / min in the low / high
# nibble of scales[j+4], their top 2 bits in bits 6-7 of scales[j-4] / scales[j].
# 4-bit data: 64 elements per 32 bytes; element l of sub-block 2c is the low
# nibble of qs[32c + l], element l of sub-block 2c+1 the high nibble.  Q5_K's
# fifth bit of those two elements is bit 2c / 2c+1 of qh[l].
# Q6_K: in each half n (128 elements) element 32g + l (g = 0..3) has its low
# nibble in ql[64n + l + 32*(g&1)] (low nibble for g < 2, high for g >= 2)
# and its top 2 bits in bits 2g..2g+1 of qh[32n + l].


def _f16(x):
    return np.asarray(x, dtype=np.float32).astype(np.float16)


def _pack_scales_k4(sc, mn):
    """sc, mn: [B, 8] ints in 0..63 -> [B, 12] uint8."""
    sc = sc.astype(np.uint8)
    mn = mn.astype(np.uint8)
    out = np.zeros((sc.shape[0], 12), np.uint8)
    out[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    out[:, 4:8] = mn[:, 0:4] | ((mn[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:8] & 0xF) | ((mn[:, 4:8] & 0xF) << 4)
    return out


def _affine_k(blocks, qmax):
    """Q4_K/Q5_K style: per sub-block of 32, w ~ d*sc*q - dmin*m, q in 0..qmax."""
    B = blocks.shape[0]
    sub = blocks.reshape(B, 8, 32).astype(np.float64)
    lo = np.minimum(sub.min(axis=2), 0.0)
    hi = np.maximum(sub.max(axis=2), 0.0)
    scale = (hi - lo) / qmax
    d = _f16(scale.max(axis=1) / 63.0)
    dmin = _f16((-lo).max(axis=1) / 63.0)
    d32, dm32 = d.astype(np.float64)[:, None], dmin.astype(np.float64)[:, None]
    sc = np.clip(np.rint(np.divide(scale, d32, out=np.zeros_like(scale), where=d32 > 0)), 0, 63)
    m = np.clip(np.rint(np.divide(-lo, dm32, out=np.zeros_like(lo), where=dm32 > 0)), 0, 63)
    es, em = d32 * sc, dm32 * m
    q = np.divide(sub + em[..., None], es[..., None], out=np.zeros_like(sub),
                  where=es[..., None] > 0)
    q = np.clip(np.rint(q), 0, qmax).astype(np.uint8)  # [B, 8, 32]
    return d, dmin, _pack_scales_k4(sc, m), q


def _nibbles(q):
    """q: [B, 8, 32] (values < 16) -> qs [B, 128]."""
    lo, hi = q[:, 0::2, :], q[:, 1::2, :]  # [B, 4, 32]: sub-blocks 2c, 2c+1
    return ((lo & 0xF) | ((hi & 0xF) << 4)).reshape(q.shape[0], 128).astype(np.uint8)


def _hdr(d, dmin):
    return np.concatenate([d.view(np.uint8).reshape(-1, 2), dmin.view(np.uint8).reshape(-1, 2)], 1)


def quant_q4_k(blocks):
    d, dmin, scales, q = _affine_k(blocks, 15)
    return np.concatenate([_hdr(d, dmin), scales, _nibbles(q)], axis=1)


def quant_q5_k(blocks):
    d, dmin, scales, q = _affine_k(blocks, 31)
    hbit = (q >> 4) & 1                               # [B, 8, 32]
    qh = np.zeros((q.shape[0], 32), np.uint8)
    for j in range(8):
        qh |= (hbit[:, j, :] << j).astype(np.uint8)
    return np.concatenate([_hdr(d, dmin), scales, qh, _nibbles(q & 0xF)], axis=1)


def quant_q6_k(blocks):
    B = blocks.shape[0]
    sub = blocks.reshape(B, 16, 16).astype(np.float64)
    scale = np.abs(sub).max(axis=2) / 31.0
    d = _f16(scale.max(axis=1) / 127.0)
    d32 = d.astype(np.float64)[:, None]
    sc = np.clip(np.rint(np.divide(scale, d32, out=np.zeros_like(scale), where=d32 > 0)), 0, 127)
    es = (d32 * sc)[..., None]
    q = np.divide(sub, es, out=np.zeros_like(sub), where=es > 0)
    q6 = (np.clip(np.rint(q), -32, 31) + 32).astype(np.uint8).reshape(B, 2, 4, 32)  # [B,n,g,l]
    low, top = q6 & 0xF, q6 >> 4
    ql = np.zeros((B, 2, 64), np.uint8)
    ql[:, :, 0:32] = low[:, :, 0] | (low[:, :, 2] << 4)
    ql[:, :, 32:64] = low[:, :, 1] | (low[:, :, 3] << 4)
    qh = (top[:, :, 0] | (top[:, :, 1] << 2) | (top[:, :, 2] << 4) | (top[:, :, 3] << 6))
    return np.concatenate([ql.reshape(B, 128), qh.reshape(B, 64).astype(np.uint8),
                           sc.astype(np.int8).view(np.uint8), d.view(np.uint8).reshape(-1, 2)],
                          axis=1)


_KQUANT = {QT.Q4_K: (quant_q4_k, 144), QT.Q5_K: (quant_q5_k, 176), QT.Q6_K: (quant_q6_k, 210)}

# Worst |dequant - x| / max|x| of each type on these Gaussian matrices, with margin:
# a packing error gives O(1).
_RT_TOL = {QT.F32: 0, QT.F16: 1e-3, QT.BF16: 5e-3, QT.Q8_0: 1e-2, QT.Q6_K: 5e-2,
           QT.Q5_0: 5e-2, QT.Q5_1: 5e-2, QT.Q5_K: 6e-2, QT.Q4_0: 0.1, QT.Q4_1: 0.1,
           QT.Q4_K: 0.12}


def encode(x, qtype):
    """x: float32 [rows, n] -> (array for GGUFWriter.add_tensor, raw_dtype)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if qtype == QT.F32:
        data, raw = x, None
    elif qtype == QT.F16:
        data, raw = x.astype(np.float16), None
    elif qtype in _KQUANT:
        fn, nb = _KQUANT[qtype]
        rows, n = x.shape
        assert n % 256 == 0, f"{qtype.name} needs rows of a multiple of 256, got {n}"
        data = fn(x.reshape(-1, 256)).reshape(rows, (n // 256) * nb)
        raw = qtype
    else:
        data, raw = quantize(x, qtype), qtype
    back = (dequantize(data, raw) if raw is not None else data.astype(np.float32)).reshape(x.shape)
    err = float(np.abs(back - x).max()) / max(float(np.abs(x).max()), 1e-30)
    if not err <= _RT_TOL[qtype]:
        raise AssertionError(f"{qtype.name}: round trip through gguf.quants.dequantize has "
                             f"relative error {err:.3g} > {_RT_TOL[qtype]} (packing bug)")
    return data, raw


# ---------------------------------------------------------------------------- tokenizer
_TEXT = (
    "The quick brown fox jumps over the lazy dog while the small cat sleeps in the warm "
    "sun. Hello there, hello world! Every morning the baker opens his shop at seven and "
    "sells fresh bread, sweet rolls and hot coffee to the people of the town. Children "
    "walk to school along the river, talking about games, stories and the weather. In "
    "the evening the lights come on, music plays in the square and friends meet to share "
    "a meal. Numbers like 1, 2, 3 and 42 appear in the text, as do words such as "
    "model, token, layer, vector, matrix, attention, inference and engine. The engine "
    "reads the model, computes the next token and writes it out; then it does it again, "
    "one token at a time, until the answer is complete or the limit is reached. "
    "Interesting things happen when the weather changes: the wind turns, the clouds "
    "gather and rain falls on the fields, the gardens and the old stone houses."
)


def make_vocab(n_vocab=N_VOCAB, n_control=2):
    """Byte symbols + BPE merges learned from _TEXT + control tokens."""
    b2u = bytes_to_unicode()
    base = [b2u[b] for b in range(256)]
    words = Counter(re.findall(r" ?[A-Za-z]+| ?[0-9]| ?[^\sA-Za-z0-9]+|\s+", _TEXT))
    seqs = {w: [b2u[b] for b in w.encode("utf-8")] for w in words}
    vocab, merges = list(base), []
    seen = set(vocab)
    while len(vocab) < n_vocab - n_control:
        pairs = Counter()
        for w, c in words.items():
            s = seqs[w]
            for a, b in zip(s, s[1:]):
                pairs[(a, b)] += c
        if not pairs:
            break
        # most frequent pair, ties broken by the pair text (deterministic)
        (a, b), _ = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))
        new = a + b
        merges.append(f"{a} {b}")
        if new not in seen:
            vocab.append(new)
            seen.add(new)
        for w in seqs:
            s, out, i = seqs[w], [], 0
            while i < len(s):
                if i + 1 < len(s) and s[i] == a and s[i + 1] == b:
                    out.append(new)
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            seqs[w] = out
    i = 0
    while len(vocab) < n_vocab - n_control:  # text exhausted: unreachable filler tokens
        vocab.append(f"<|unused{i}|>")
        i += 1
    types = [1] * len(vocab)
    for s in ("<|endoftext|>", "<|im_end|>")[:n_control]:
        vocab.append(s)
        types.append(3)
    assert len(vocab) == n_vocab and len(set(vocab)) == n_vocab
    return vocab, types, merges


# ---------------------------------------------------------------------------- models
def _add_tokenizer(w, vocab, types, merges, pre="gpt2", bos=None):
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(vocab)
    w.add_token_types(types)
    w.add_token_merges(merges)
    eos = vocab.index("<|endoftext|>")
    w.add_bos_token_id(eos if bos is None else bos)
    w.add_eos_token_id(eos)
    w.add_add_bos_token(False)


def _vec(w, name, x, kind):
    x = np.asarray(x, dtype=np.float32)
    if kind == "F32":
        w.add_tensor(name, x)
    elif kind == "F16":
        w.add_tensor(name, x.astype(np.float16))
    elif kind == "BF16":
        w.add_tensor(name, quantize(x, QT.BF16), raw_dtype=QT.BF16)
    else:
        raise ValueError(kind)


def _mat(w, name, x, qtype):
    """x: [rows, n], or [experts, rows, n] for the experts' 3-D tensors."""
    if x.ndim == 3:
        data, raw = encode(x.reshape(-1, x.shape[2]), qtype)
        data = data.reshape(x.shape[0], x.shape[1], -1)
    else:
        data, raw = encode(x, qtype)
    if raw is None:
        w.add_tensor(name, data)
    else:
        w.add_tensor(name, data, raw_dtype=raw)


def _add_meta(w, arch, meta):
    """meta: {key after "<arch>.": int (u32) | float (f32) | str}."""
    for k, v in meta.items():
        key = f"{arch}.{k}"
        if isinstance(v, str):
            w.add_string(key, v)
        elif isinstance(v, int):
            w.add_uint32(key, v)
        else:
            w.add_float32(key, float(v))


def llama3_rope_factors(head_dim, base, factor, low_freq_factor, high_freq_factor, old_ctx):
    """Llama 3.1's RoPE frequency divisors (its rope_scaling "llama3"): pairs whose
    wavelength is short against the original context keep their frequency, long ones
    are divided by `factor`, those between blend smoothly."""
    out = []
    for i in range(0, head_dim, 2):
        freq = base ** (-i / head_dim)
        wavelen = 2 * np.pi / freq
        if wavelen < old_ctx / high_freq_factor:
            out.append(1.0)
        elif wavelen > old_ctx / low_freq_factor:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, np.float32)


def build(path, arch, cfg, types_for_layer, embd_type, out_type, norm_kinds, biases, rng,
          meta=None, qk_norm=False, rope_freqs=None, pre="gpt2", extra_tensors=None,
          experts=None, post_norms=False, fused=False, rope_long_short=None, tok_edit=None,
          bos=None, general=None, chat_template=None):
    """experts: dict(n=, ffn=) for a mixture-of-experts FFN (an F32 router and 3-D
    gate/up/down tensors of types t["gate"], t["up"], t["down"]) instead of the dense
    one; the expert counts go in meta.  fused (Phi-3): q/k/v in one attn_qkv tensor of
    type t["q"], gate and up rows in one ffn_up of type t["up"].  rope_long_short:
    (long, short) LongRoPE factor vectors.  tok_edit(vocab, types, merges) -> the same
    three, bos (an id), general ({key: u32} under "general.") and chat_template (a
    string) bend the header for the loader's strictness tests."""
    d, L, H, Hkv, hd, ffn = (cfg[k] for k in ("d", "layers", "heads", "kv_heads", "head_dim", "ffn"))
    vocab, ttypes, merges = make_vocab()
    w = gguf.GGUFWriter(path, arch)
    w.add_name(os.path.splitext(os.path.basename(path))[0])
    w.add_context_length(cfg["ctx"])
    w.add_embedding_length(d)
    w.add_block_count(L)
    w.add_feed_forward_length(ffn)
    w.add_head_count(H)
    w.add_head_count_kv(Hkv)
    w.add_rope_freq_base(cfg["rope_base"])
    w.add_layer_norm_rms_eps(cfg["eps"])
    w.add_rope_dimension_count(cfg.get("rope_dim", hd))
    if hd * H != d:
        w.add_key_length(hd)
        w.add_value_length(hd)
    _add_meta(w, arch, meta or {})
    for k, v in (general or {}).items():
        w.add_uint32(f"general.{k}", v)
    if tok_edit:
        vocab, ttypes, merges = tok_edit(list(vocab), list(ttypes), list(merges))
    _add_tokenizer(w, vocab, ttypes, merges, pre, bos)
    if chat_template is not None:
        w.add_chat_template(chat_template)

    def norm(n):  # norm weights around 1
        return 1.0 + 0.2 * rng.standard_normal(n)

    sig = cfg["sigma"]
    # The embedding is comparable to what the layers add, so the (tied) logits are
    # not dominated by the input token itself.
    emb = cfg["embd_sigma"] * rng.standard_normal((N_VOCAB, d))
    _mat(w, "token_embd.weight", emb, embd_type)
    qd, kd = H * hd, Hkv * hd
    for li in range(L):
        t = types_for_layer(li)
        p = f"blk.{li}."
        _vec(w, p + "attn_norm.weight", norm(d), norm_kinds[0])
        q = sig * rng.standard_normal((qd, d))
        k = sig * rng.standard_normal((kd, d))
        v = sig * rng.standard_normal((kd, d))
        if fused:
            _mat(w, p + "attn_qkv.weight", np.concatenate([q, k, v]), t["q"])
        else:
            _mat(w, p + "attn_q.weight", q, t["q"])
            _mat(w, p + "attn_k.weight", k, t["k"])
            _mat(w, p + "attn_v.weight", v, t["v"])
        if biases:
            _vec(w, p + "attn_q.bias", 0.5 * rng.standard_normal(qd), "F32")
            _vec(w, p + "attn_k.bias", 0.5 * rng.standard_normal(kd), "F32")
            _vec(w, p + "attn_v.bias", 0.2 * rng.standard_normal(kd), "F32")
        if qk_norm:
            _vec(w, p + "attn_q_norm.weight", norm(hd), "F32")
            _vec(w, p + "attn_k_norm.weight", norm(hd), "F32")
        _mat(w, p + "attn_output.weight", sig * rng.standard_normal((d, qd)), t["o"])
        if post_norms:
            _vec(w, p + "post_attention_norm.weight", norm(d), "F32")
        _vec(w, p + "ffn_norm.weight", norm(d), norm_kinds[1])
        if experts:
            ne, fe = experts["n"], experts["ffn"]
            # a router of unit-ish logits: the top-k choices differ from token to token
            _mat(w, p + "ffn_gate_inp.weight", 0.5 * rng.standard_normal((ne, d)), QT.F32)
            _mat(w, p + "ffn_gate_exps.weight", sig * rng.standard_normal((ne, fe, d)), t["gate"])
            _mat(w, p + "ffn_up_exps.weight", sig * rng.standard_normal((ne, fe, d)), t["up"])
            _mat(w, p + "ffn_down_exps.weight", sig * rng.standard_normal((ne, d, fe)), t["down"])
            fs = experts.get("shared")
            if fs:  # Qwen2-MoE's shared expert and its (1-D, F32) gate
                _vec(w, p + "ffn_gate_inp_shexp.weight", 0.5 * rng.standard_normal(d), "F32")
                _mat(w, p + "ffn_gate_shexp.weight", sig * rng.standard_normal((fs, d)), t["gate"])
                _mat(w, p + "ffn_up_shexp.weight", sig * rng.standard_normal((fs, d)), t["up"])
                _mat(w, p + "ffn_down_shexp.weight", sig * rng.standard_normal((d, fs)), t["down"])
            continue
        gate = sig * rng.standard_normal((ffn, d))
        up = sig * rng.standard_normal((ffn, d))
        if fused:
            _mat(w, p + "ffn_up.weight", np.concatenate([gate, up]), t["up"])
        else:
            _mat(w, p + "ffn_gate.weight", gate, t["gate"])
            _mat(w, p + "ffn_up.weight", up, t["up"])
        _mat(w, p + "ffn_down.weight", sig * rng.standard_normal((d, ffn)), t["down"])
        if post_norms:
            _vec(w, p + "post_ffw_norm.weight", norm(d), "F32")
    _vec(w, "output_norm.weight", norm(d), norm_kinds[2])
    if out_type is not None:
        _mat(w, "output.weight", cfg["out_sigma"] * rng.standard_normal((N_VOCAB, d)), out_type)
    if rope_freqs is not None:
        _vec(w, "rope_freqs.weight", rope_freqs, "F32")
    if rope_long_short is not None:
        _vec(w, "rope_factors_long.weight", rope_long_short[0], "F32")
        _vec(w, "rope_factors_short.weight", rope_long_short[1], "F32")
    for name, x in (extra_tensors or {}).items():  # tests of the loader's strictness
        w.add_tensor(name, np.asarray(x, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


ROLES = ("q", "k", "v", "o", "gate", "up", "down")
LLAMA_TYPES = (QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.Q8_0, QT.Q5_1)
# qwen2: F32 only on the small k/v matrices to keep the file small
QWEN2_LAYERS = (
    dict(q=QT.Q4_0, k=QT.F32, v=QT.BF16, o=QT.F16, gate=QT.Q5_0, up=QT.Q4_0, down=QT.BF16),
    dict(q=QT.Q5_0, k=QT.BF16, v=QT.F32, o=QT.Q4_0, gate=QT.F16, up=QT.Q5_0, down=QT.Q4_0),
)


def _rotating(types):
    # layer l, role r -> types[(r + 2l) % n]: with 7 roles and 5 types, each type
    # lands on at least two different roles over the two layers
    return lambda li: {r: types[(i + 2 * li) % len(types)] for i, r in enumerate(ROLES)}


MODELS = {
    "tiny-llama-kquants.gguf": dict(
        arch="llama",
        cfg=dict(d=256, layers=2, heads=4, kv_heads=2, head_dim=64, ffn=512, ctx=512,
                 rope_base=10000.0, eps=1e-5, sigma=0.08, embd_sigma=0.1, out_sigma=None),
        types_for_layer=_rotating(LLAMA_TYPES), embd_type=QT.Q6_K, out_type=None,
        norm_kinds=("F32", "F32", "F32"), biases=False),
    "tiny-qwen2.gguf": dict(
        arch="qwen2",
        cfg=dict(d=192, layers=2, heads=6, kv_heads=2, head_dim=32, ffn=512, ctx=512,
                 rope_base=1e6, eps=1e-6, sigma=0.05, embd_sigma=0.3, out_sigma=0.1),
        types_for_layer=lambda li: QWEN2_LAYERS[li], embd_type=QT.BF16, out_type=QT.F16,
        norm_kinds=("F16", "BF16", "F16"), biases=True),
    # Llama 3.2's structure: rope_freqs (Llama 3.1+ RoPE factors, an original context
    # of 64 so that the factors span 1..8 over these 16 pairs), freq_base 5e5, GQA
    # group 4, tied Q6_K embeddings, Q4_K_M's type mix, the llama-bpe pre-tokenizer.
    "tiny-llama3.gguf": dict(
        arch="llama",
        cfg=dict(d=256, layers=2, heads=8, kv_heads=2, head_dim=32, ffn=768, ctx=512,
                 rope_base=5e5, eps=1e-5, sigma=0.08, embd_sigma=0.1, out_sigma=None),
        types_for_layer=lambda li: dict(q=QT.Q4_K, k=QT.Q4_K, v=QT.Q6_K, o=QT.Q4_K,
                                        gate=QT.Q4_K, up=QT.Q4_K, down=QT.Q6_K),
        embd_type=QT.Q6_K, out_type=None, norm_kinds=("F32", "F32", "F32"), biases=False,
        rope_freqs=llama3_rope_factors(32, 5e5, 8.0, 1.0, 4.0, 64), pre="llama-bpe"),
    # Qwen3: per-head q/k RMSNorm, heads of 64 wider than d / heads (q is 256 wide for
    # d 192), no biases, YaRN RoPE scaling (factor 4 over an original context of 128).
    "tiny-qwen3.gguf": dict(
        arch="qwen3",
        cfg=dict(d=192, layers=2, heads=4, kv_heads=2, head_dim=64, ffn=512, ctx=512,
                 rope_base=1e6, eps=1e-6, sigma=0.06, embd_sigma=0.2, out_sigma=None),
        types_for_layer=lambda li: dict(q=QT.Q8_0, k=QT.Q8_0, v=QT.Q8_0, o=QT.Q4_K,
                                        gate=QT.Q8_0, up=QT.Q4_0, down=QT.Q6_K),
        embd_type=QT.Q8_0, out_type=None, norm_kinds=("F32", "F32", "F32"), biases=False,
        qk_norm=True, pre="qwen2",
        meta={"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0,
              "rope.scaling.original_context_length": 128}),
    # Granite: its four multipliers and linear RoPE scaling, multi-head attention, a
    # separate Q8_0 output matrix.
    "tiny-granite.gguf": dict(
        arch="granite",
        cfg=dict(d=256, layers=2, heads=4, kv_heads=4, head_dim=64, ffn=512, ctx=512,
                 rope_base=1e4, eps=1e-5, sigma=0.08, embd_sigma=0.05, out_sigma=0.1),
        types_for_layer=_rotating((QT.Q5_K, QT.Q8_0, QT.F16)), embd_type=QT.F16,
        out_type=QT.Q8_0, norm_kinds=("F32", "F32", "F32"), biases=False,
        meta={"embedding_scale": 4.0, "residual_scale": 0.5, "attention.scale": 0.03,
              "logit_scale": 2.0, "rope.scaling.type": "linear", "rope.scaling.factor": 2.0}),
    # Qwen3-MoE: 16 experts of 256, 4 per token, q/k norms; Q4_K gate/up, Q6_K down.
    "tiny-qwen3moe.gguf": dict(
        arch="qwen3moe",
        cfg=dict(d=256, layers=2, heads=4, kv_heads=2, head_dim=64, ffn=512, ctx=512,
                 rope_base=1e6, eps=1e-6, sigma=0.08, embd_sigma=0.2, out_sigma=0.1),
        types_for_layer=lambda li: dict(q=QT.Q8_0, k=QT.Q8_0, v=QT.Q8_0, o=QT.Q4_K,
                                        gate=QT.Q4_K, up=QT.Q4_K, down=QT.Q6_K),
        embd_type=QT.Q8_0, out_type=QT.Q6_K, norm_kinds=("F32", "F32", "F32"), biases=False,
        qk_norm=True, pre="qwen2", experts=dict(n=16, ffn=256),
        meta={"expert_count": 16, "expert_used_count": 4, "expert_feed_forward_length": 256}),
    # Mixtral: arch "llama" with 4 experts of 512, 2 per token, GQA, tied embeddings.
    "tiny-mixtral.gguf": dict(
        arch="llama",
        cfg=dict(d=256, layers=2, heads=4, kv_heads=2, head_dim=64, ffn=512, ctx=512,
                 rope_base=1e6, eps=1e-5, sigma=0.08, embd_sigma=0.1, out_sigma=None),
        types_for_layer=lambda li: dict(q=QT.Q5_K, k=QT.Q5_K, v=QT.Q8_0, o=QT.Q5_K,
                                        gate=QT.Q8_0, up=QT.Q8_0, down=QT.Q4_K),
        embd_type=QT.Q8_0, out_type=None, norm_kinds=("F32", "F32", "F32"), biases=False,
        experts=dict(n=4, ffn=512), meta={"expert_count": 4, "expert_used_count": 2}),
    # Gemma 3: 4 layers of which every 2nd is global (pattern 2), the others see a
    # window of 8 positions with their own RoPE base; GeGLU, q/k norms, post-norms,
    # heads of 64 (q 256 wide for d 192), MQA, final logits soft-capped at 8 (they
    # reach ~5 through the separate output matrix, so the cap bends them).
    "tiny-gemma3.gguf": dict(
        arch="gemma3",
        cfg=dict(d=192, layers=4, heads=4, kv_heads=1, head_dim=64, ffn=512, ctx=512,
                 rope_base=1e6, eps=1e-6, sigma=0.06, embd_sigma=0.02, out_sigma=0.4),
        types_for_layer=lambda li: dict(q=QT.Q8_0, k=QT.Q8_0, v=QT.Q8_0, o=QT.Q4_K,
                                        gate=QT.Q8_0, up=QT.Q5_0, down=QT.Q6_K),
        embd_type=QT.Q8_0, out_type=QT.Q8_0, norm_kinds=("F32", "F32", "F32"), biases=False,
        qk_norm=True, post_norms=True,
        meta={"attention.sliding_window": 8, "attention.sliding_window_pattern": 2,
              "rope.freq_base_swa": 10000.0, "final_logit_softcapping": 8.0}),
    # Ministral 3 ("mistral3"): YaRN with its beta keys and mscale_all_dim
    # (yarn_log_multiplier 0.5 here, so the magnitude correction is neither 1 nor the
    # plain YaRN gain), adjacent-pair RoPE, GQA.
    "tiny-mistral3.gguf": dict(
        arch="mistral3",
        cfg=dict(d=256, layers=2, heads=8, kv_heads=2, head_dim=32, ffn=512, ctx=512,
                 rope_base=1e6, eps=1e-5, sigma=0.08, embd_sigma=0.1, out_sigma=0.1),
        types_for_layer=_rotating((QT.Q4_K, QT.Q6_K, QT.Q8_0)), embd_type=QT.Q6_K,
        out_type=QT.Q6_K, norm_kinds=("F32", "F32", "F32"), biases=False,
        meta={"rope.scaling.type": "yarn", "rope.scaling.factor": 16.0,
              "rope.scaling.original_context_length": 32, "rope.scaling.yarn_beta_fast": 16.0,
              "rope.scaling.yarn_beta_slow": 2.0, "rope.scaling.yarn_log_multiplier": 0.5}),
    # Gemma 2: GeGLU, post-norms, no q/k norms, every other layer windowed (8 here) with
    # the global RoPE, attention scores soft-capped at 1.5 and logits at 8, tied output.
    "tiny-gemma2.gguf": dict(
        arch="gemma2",
        cfg=dict(d=256, layers=4, heads=4, kv_heads=2, head_dim=64, ffn=512, ctx=512,
                 rope_base=1e4, eps=1e-6, sigma=0.06, embd_sigma=0.1, out_sigma=None),
        types_for_layer=lambda li: dict(q=QT.Q8_0, k=QT.Q8_0, v=QT.Q8_0, o=QT.Q4_K,
                                        gate=QT.Q5_K, up=QT.Q5_K, down=QT.Q6_K),
        embd_type=QT.Q8_0, out_type=None, norm_kinds=("F32", "F32", "F32"), biases=False,
        post_norms=True,
        meta={"attention.sliding_window": 8, "attn_logit_softcapping": 1.5,
              "final_logit_softcapping": 8.0}),
    # Phi-3: fused attn_qkv and gate+up tensors, LongRoPE (long factors: the context,
    # 512, exceeds the original 64) with its attention factor, a window of 12 on every
    # layer, partial rotation (48 of 64 dimensions).
    "tiny-phi3.gguf": dict(
        arch="phi3",
        cfg=dict(d=256, layers=2, heads=4, kv_heads=4, head_dim=64, ffn=512, ctx=512,
                 rope_base=1e4, eps=1e-5, sigma=0.08, embd_sigma=0.1, out_sigma=0.1,
                 rope_dim=48),
        types_for_layer=lambda li: dict(q=QT.Q8_0, k=None, v=None, o=QT.Q4_K,
                                        gate=None, up=QT.Q5_K, down=QT.Q6_K),
        embd_type=QT.Q8_0, out_type=QT.Q6_K, norm_kinds=("F32", "F32", "F32"), biases=False,
        fused=True, rope_long_short=(np.linspace(1.0, 6.0, 24, dtype=np.float32),
                                     np.linspace(1.0, 1.5, 24, dtype=np.float32)),
        meta={"rope.scaling.original_context_length": 64, "rope.scaling.attn_factor": 1.19,
              "attention.sliding_window": 12}),
    # Qwen2-MoE: 8 experts of 256 (2 per token, probabilities not renormalized), a shared
    # expert of 384 behind a sigmoid gate, q/k/v biases, NeoX RoPE.
    "tiny-qwen2moe.gguf": dict(
        arch="qwen2moe",
        cfg=dict(d=256, layers=2, heads=4, kv_heads=2, head_dim=64, ffn=512, ctx=512,
                 rope_base=1e6, eps=1e-6, sigma=0.08, embd_sigma=0.2, out_sigma=0.1),
        types_for_layer=lambda li: dict(q=QT.Q8_0, k=QT.Q8_0, v=QT.Q8_0, o=QT.Q4_K,
                                        gate=QT.Q8_0, up=QT.Q8_0, down=QT.Q6_K),
        embd_type=QT.Q8_0, out_type=QT.Q6_K, norm_kinds=("F32", "F32", "F32"), biases=True,
        pre="qwen2", experts=dict(n=8, ffn=256, shared=512),
        meta={"expert_count": 8, "expert_used_count": 2, "expert_feed_forward_length": 256,
              "expert_shared_feed_forward_length": 512}),
}


# Each model's random numbers are seeded by its position in MODELS: add new models at the
# end, or every later model (and its recorded llama.cpp reference, tests/ref/logits/)
# changes.
# Models only test_engine runs (no llama.cpp reference; in OUTDIR/engine): Gemma 3 with
# one global layer of four, so the KV pool keeps a quarter of a block behind the windows
# (mm/kv.h), under real model arithmetic.
_G3 = MODELS["tiny-gemma3.gguf"]
ENGINE_MODELS = {
    "tiny-gemma3-quarters.gguf": dict(_G3, meta=dict(_G3["meta"], **{"attention.sliding_window_pattern": 4})),
}


def make_all(outdir):
    os.makedirs(os.path.join(outdir, "engine"), exist_ok=True)
    paths = []
    todo = [(name, spec) for name, spec in MODELS.items()]
    todo += [(os.path.join("engine", name), spec) for name, spec in ENGINE_MODELS.items()]
    for i, (name, spec) in enumerate(todo):
        rng = np.random.default_rng(SEED + i)
        path = os.path.join(outdir, name)
        tmp = path + ".tmp"
        build(tmp, rng=rng, **spec)
        os.replace(tmp, path)
        paths.append(path)
    return paths


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0].startswith("-"):
        sys.stderr.write("usage: make_tiny_models.py OUTDIR\n")
        return 2
    t0 = time.time()
    for p in make_all(argv[0]):
        print(f"{p}: {os.path.getsize(p)} bytes")
    sys.stderr.write(f"make_tiny_models: {time.time() - t0:.2f}s\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
