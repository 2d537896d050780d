#!/usr/bin/env python3
"""Independent NumPy reference forward pass for Llama-family GGUF models.

Test-only; written from the published math, not from any inference engine:

  x      = token_embd[ids]
  per layer:
    h    = rmsnorm(x) * attn_norm
    q,k,v= h @ Wq^T (+bq), h @ Wk^T (+bk), h @ Wv^T (+bv)     (split into heads)
    q,k  = rope(q, pos), rope(k, pos)
    a    = softmax(q k^T / sqrt(head_dim) + causal_mask) v      (GQA: q head h
                                                                 uses kv head h // group)
    x    = x + a @ Wo^T
    h    = rmsnorm(x) * ffn_norm
    x    = x + (silu(h @ Wgate^T) * (h @ Wup^T)) @ Wdown^T
  logits = (rmsnorm(x) * output_norm) @ Wout^T   (Wout = token_embd when tied)

GGUF conventions that matter here:
  * a tensor with ne = [ne0, ne1] is a numpy array of shape (ne1, ne0); for a
    weight matrix ne0 is the input dimension, so y = x @ W.T.
  * llama.cpp's HF->GGUF converter permutes the rows of attn_q/attn_k for the
    "llama" architecture so that RoPE rotates ADJACENT pairs (x[2i], x[2i+1])
    ("normal" mode).  Architectures converted without that permutation (qwen2,
    phi3, ...) use the NeoX layout: pairs (x[i], x[i + n_rot/2]).
  * theta_i = pos * freq_base^(-2i/n_rot), i in [0, n_rot/2); dimensions past
    n_rot (rope.dimension_count) are not rotated.

Weights are dequantized once with gguf.quants.dequantize to float32; the matrix
products run in float32 (BLAS), norms / softmax / RoPE angles in float64.

API:
  m = load(path)
  m.forward(tokens, start_pos) -> float32 logits [len(tokens), n_vocab]
      (appends to the model's KV cache; start_pos must equal the cache length)
  m.reset()
  greedy(m, prompt_ids, n, stop_ids=()) -> (ids, logits of last prompt position)
  m.detok(ids) -> str
"""
import argparse
import sys
import time

import numpy as np

try:
    import gguf
except ImportError:  # pragma: no cover
    sys.stderr.write("ref_llama: needs the 'gguf' package (tests/requirements.txt)\n")
    raise

# Architectures whose GGUF q/k weights are in NeoX (half-split) rope layout.
NEOX_ARCHS = {"qwen2", "qwen2moe", "qwen3", "qwen3moe", "phi3", "stablelm",
              "gptneox", "falcon", "olmo2", "starcoder2", "exaone", "gemma2", "gemma3"}


def bytes_to_unicode():
    """GPT-2's reversible byte <-> printable-unicode table."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + \
        list(range(0xAE, 0xFF + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


_BYTE_DECODER = {v: k for k, v in bytes_to_unicode().items()}


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


class Model:
    def __init__(self, path, verbose=False, emulate_q8=False, n_ctx=None):
        t0 = time.time()
        # emulate_q8: round matmul activations to 8-bit blocks of 32 (fp16 scale)
        # and q/k/v/attention probabilities to fp16, the way llama.cpp-style
        # integer kernels with an f16 KV cache do.  Only used to size the
        # parity tolerances; the reference proper runs with emulate_q8=False.
        self.emulate_q8 = emulate_q8
        r = gguf.GGUFReader(path)
        self.path = path
        arch = _field(r, "general.architecture")
        self.arch = arch

        def kv(key, default=None):
            return _field(r, f"{arch}.{key}", default)

        self.n_layer = int(kv("block_count"))
        self.n_embd = int(kv("embedding_length"))
        self.n_head = int(kv("attention.head_count"))
        self.n_head_kv = int(kv("attention.head_count_kv", self.n_head))
        self.head_dim = int(kv("attention.key_length", self.n_embd // self.n_head))
        self.head_dim_v = int(kv("attention.value_length", self.head_dim))
        self.eps = float(kv("attention.layer_norm_rms_epsilon", 1e-5))
        self.freq_base = float(kv("rope.freq_base", 10000.0))
        self.n_rot = int(kv("rope.dimension_count", self.head_dim))
        self.n_ctx_train = int(kv("context_length", 4096))
        # RoPE scaling, as llama.cpp reads it: a factor without a type is linear
        scale_type = kv("rope.scaling.type", "linear")
        factor = float(kv("rope.scaling.factor", kv("rope.scale_linear", 0.0)) or 0.0)
        fscale = 1.0 / factor if factor > 0 and scale_type != "none" else 1.0
        self.rope_mscale = float(kv("rope.scaling.attn_factor", 1.0))
        # Granite's multipliers (llama.cpp: 0 or absent means none)
        self.embd_scale = float(kv("embedding_scale", 0.0) or 1.0)
        self.resid_scale = float(kv("residual_scale", 0.0) or 1.0)
        self.logit_scale = float(kv("logit_scale", 0.0) or 1.0)
        self.attn_scale = float(kv("attention.scale", 0.0) or 0.0)
        self.neox = arch in NEOX_ARCHS
        # Gemma 2/3 (gemma_pytorch): embeddings times sqrt(d), GeGLU, norms on the
        # attention and FFN outputs, sliding-window layers (Gemma 3: with their own RoPE
        # base); Gemma 2 also soft-caps the attention scores and always the logits
        self.gemma = arch in ("gemma2", "gemma3")
        g2 = arch == "gemma2"
        if self.gemma:
            self.embd_scale = float(np.float32(np.sqrt(self.n_embd)))
            big = self.n_layer == (46 if g2 else 62)  # the 27B: query_pre_attn_scalar d/heads
            self.attn_scale = 1.0 / np.sqrt(self.n_embd // self.n_head if big else self.head_dim)
        self.softcap = float(kv("final_logit_softcapping", 30.0 if g2 else 0.0) or 0.0)
        self.attn_softcap = float(kv("attn_logit_softcapping", 50.0) or 0.0) if g2 else 0.0
        self.n_swa = int(kv("attention.sliding_window", 4096 if g2 else 0) or 0) if self.gemma else 0
        pat = kv("attention.sliding_window_pattern", 2 if g2 else 6)
        if isinstance(pat, (list, tuple)):
            self.swa_layer = [bool(x) for x in pat]
        else:
            self.swa_layer = [int(pat) == 0 or i % int(pat) < int(pat) - 1 for i in range(self.n_layer)]
        self.swa_layer = [self.n_swa > 0 and w for w in self.swa_layer]
        base_swa = float(kv("rope.freq_base_swa", 10000.0))
        self.swa_own_rope = not g2 or kv("rope.freq_base_swa") is not None
        self.n_expert = int(kv("expert_count", 0) or 0)
        self.n_expert_used = int(kv("expert_used_count", 0) or 0)
        self.expert_norm = arch != "qwen2moe"  # Qwen2-MoE keeps the softmax probabilities
        if self.n_head % self.n_head_kv:
            raise ValueError("n_head not a multiple of n_head_kv")

        self.tokens = _field(r, "tokenizer.ggml.tokens", [])
        self.token_type = _field(r, "tokenizer.ggml.token_type", [])
        self.tok_model = _field(r, "tokenizer.ggml.model", "gpt2")
        self.special = {}
        for name in ("bos", "eos", "eot", "eom", "unknown", "padding"):
            v = _field(r, f"tokenizer.ggml.{name}_token_id")
            if v is not None:
                self.special[name] = int(v)

        tensors = {t.name: t for t in r.tensors}
        self._tinfo = {n: (t.tensor_type.name, tuple(int(x) for x in t.shape))
                       for n, t in tensors.items()}

        def W(name, required=True):
            t = tensors.get(name)
            if t is None:
                if required:
                    raise KeyError(f"missing tensor {name}")
                return None
            a = gguf.quants.dequantize(t.data, t.tensor_type)
            # numpy shape is ne reversed
            shape = tuple(int(x) for x in reversed(t.shape))
            return np.ascontiguousarray(a.reshape(shape), dtype=np.float32)

        self.tok_embd = W("token_embd.weight")
        self.out_norm = W("output_norm.weight")
        out = W("output.weight", required=False)
        self.tied = out is None
        self.out_w = self.tok_embd if out is None else out
        self.n_vocab = self.out_w.shape[0]
        ff = W("rope_freqs.weight", required=False)  # llama3-style frequency factors
        # Phi-3's LongRoPE: the long factors when the context (kilnd generate's default:
        # the trained one) exceeds the original, else the short ones
        if ff is None and "rope_factors_long.weight" in tensors:
            orig = int(kv("rope.scaling.original_context_length", self.n_ctx_train))
            long_ = (n_ctx or self.n_ctx_train) > orig
            ff = W("rope_factors_long.weight" if long_ else "rope_factors_short.weight")
        if arch == "phi3":
            self.n_swa = int(kv("attention.sliding_window", 0) or 0)
            self.swa_layer = [self.n_swa > 0] * self.n_layer
            self.phi3_same_rope = True
        self.layers = []
        for i in range(self.n_layer):
            p = f"blk.{i}."
            qkv = W(p + "attn_qkv.weight", False)  # Phi-3: q, k, v rows in one tensor
            qd, kd = self.n_head * self.head_dim, self.n_head_kv * self.head_dim
            L = {
                "attn_norm": W(p + "attn_norm.weight"),
                "wq": qkv[:qd] if qkv is not None else W(p + "attn_q.weight"),
                "wk": qkv[qd:qd + kd] if qkv is not None else W(p + "attn_k.weight"),
                "wv": qkv[qd + kd:] if qkv is not None else W(p + "attn_v.weight"),
                "wo": W(p + "attn_output.weight"),
                "bq": W(p + "attn_q.bias", False),
                "bk": W(p + "attn_k.bias", False),
                "bv": W(p + "attn_v.bias", False),
                "bo": W(p + "attn_output.bias", False),
                "q_norm": W(p + "attn_q_norm.weight", False),  # qwen3-style per-head norm
                "k_norm": W(p + "attn_k_norm.weight", False),
                "ffn_norm": W(p + "ffn_norm.weight"),
                "attn_post_norm": W(p + "post_attention_norm.weight", False),
                "ffn_post_norm": W(p + "post_ffw_norm.weight", False),
            }
            if self.n_expert:
                L["router"] = W(p + "ffn_gate_inp.weight")
                for k, n in (("gate_exps", "ffn_gate_exps"), ("up_exps", "ffn_up_exps"),
                             ("down_exps", "ffn_down_exps")):
                    a = W(p + n + ".weight")        # [experts, rows, n]
                    L[k] = [a[e] for e in range(a.shape[0])]  # stable objects (q8 emulation)
                if p + "ffn_gate_inp_shexp.weight" in tensors:  # Qwen2-MoE's shared expert
                    L["sh_gate_inp"] = W(p + "ffn_gate_inp_shexp.weight").reshape(1, -1)
                    for k, n in (("sh_gate", "ffn_gate_shexp"), ("sh_up", "ffn_up_shexp"),
                                 ("sh_down", "ffn_down_shexp")):
                        L[k] = W(p + n + ".weight")
            elif arch == "phi3":  # gate rows, then up rows, in ffn_up
                gu = W(p + "ffn_up.weight")
                L["gate"], L["up"] = gu[:gu.shape[0] // 2], gu[gu.shape[0] // 2:]
                L["down"] = W(p + "ffn_down.weight")
                L["_fused"] = {"wq": "attn_qkv", "wk": "attn_qkv", "wv": "attn_qkv",
                               "gate": "ffn_up"}
            else:
                L["gate"] = W(p + "ffn_gate.weight")
                L["up"] = W(p + "ffn_up.weight")
                L["down"] = W(p + "ffn_down.weight")
            self.layers.append(L)

        half = self.n_rot // 2
        i = np.arange(half, dtype=np.float64)
        inv = self.freq_base ** (-2.0 * i / self.n_rot)
        if ff is not None:
            inv = inv / ff.astype(np.float64)[:half]
        if scale_type == "yarn":
            # YaRN (Peng et al. 2023): pairs that turn many times within the original
            # context are extrapolated (kept), slow ones interpolated (scaled by
            # 1/factor), a linear ramp between; cos/sin gain 1 + 0.1 ln(factor).
            orig = int(kv("rope.scaling.original_context_length", self.n_ctx_train))
            beta_fast = float(kv("rope.scaling.yarn_beta_fast", 32.0))
            beta_slow = float(kv("rope.scaling.yarn_beta_slow", 1.0))

            def corr(turns):
                return self.n_rot * np.log(orig / (turns * 2 * np.pi)) / (2 * np.log(self.freq_base))
            lo = max(0.0, np.floor(corr(beta_fast)))
            hi = min(self.n_rot - 1.0, np.ceil(corr(beta_slow)))
            keep = 1.0 - np.clip((i - lo) / max(0.001, hi - lo), 0.0, 1.0)
            inv = inv * (fscale * (1.0 - keep) + keep)
            if factor > 1.0:  # mscale_all_dim (yarn_log_multiplier) divides the gain
                log_mul = float(kv("rope.scaling.yarn_log_multiplier", 0.0) or 0.0)
                gain = 1.0 + 0.1 * np.log(factor)
                self.rope_mscale *= gain / (1.0 + 0.1 * log_mul * np.log(factor)) if log_mul else gain
        else:
            inv = inv * fscale
        self.inv_freq = inv
        self.inv_freq_swa = base_swa ** (-2.0 * i / self.n_rot)  # windowed layers: unscaled
        if getattr(self, "phi3_same_rope", False) or not self.swa_own_rope:
            self.inv_freq_swa = inv  # Phi-3's and Gemma 2's windows keep the layers' RoPE
            self.phi3_same_rope = True
        self.reset()
        if verbose:
            sys.stderr.write(
                f"ref_llama: {arch} L={self.n_layer} d={self.n_embd} heads={self.n_head}/"
                f"{self.n_head_kv} hd={self.head_dim} vocab={self.n_vocab} rope="
                f"{'neox' if self.neox else 'norm'} base={self.freq_base} n_rot={self.n_rot} "
                f"tied={self.tied} loaded in {time.time() - t0:.1f}s\n")

    # ------------------------------------------------------------------ cache
    def reset(self):
        self.n_past = 0
        self._cap = 0
        self.kc = [None] * self.n_layer
        self.vc = [None] * self.n_layer

    def _grow(self, need):
        if need <= self._cap:
            return
        cap = max(need, 2 * self._cap, 64)
        for i in range(self.n_layer):
            k = np.zeros((self.n_head_kv, cap, self.head_dim), np.float32)
            v = np.zeros((self.n_head_kv, cap, self.head_dim_v), np.float32)
            if self.kc[i] is not None:
                k[:, :self._cap] = self.kc[i][:, :self._cap]
                v[:, :self._cap] = self.vc[i][:, :self._cap]
            self.kc[i], self.vc[i] = k, v
        self._cap = cap

    # ------------------------------------------------------------------ math
    @staticmethod
    def _q8(x):
        """Round rows of x to int8 blocks of 32 with an fp16 scale amax/127."""
        shp = x.shape
        b = x.astype(np.float32).reshape(-1, 32)
        d = (np.abs(b).max(axis=1, keepdims=True) / 127.0).astype(np.float16).astype(np.float32)
        inv = np.where(d > 0, 1.0 / np.where(d > 0, d, 1), 0)
        q = np.clip(np.rint(b * inv), -127, 127)
        return (q * d).reshape(shp).astype(np.float32)

    def _mm(self, x, w):
        if self.emulate_q8 and x.shape[-1] % 32 == 0:
            x = self._q8(x)
        return x @ w.T

    def _h(self, x):
        return x.astype(np.float16).astype(np.float32) if self.emulate_q8 else x

    def _rmsnorm(self, x, w):
        x64 = x.astype(np.float64)
        r = 1.0 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + self.eps)
        return (x64 * r * w).astype(np.float32)

    def _rope(self, x, pos, swa=False):
        """x: [n_heads, T, head_dim]; pos: [T] absolute positions."""
        inv, ms = (self.inv_freq_swa, 1.0) if swa else (self.inv_freq, self.rope_mscale)
        if swa and getattr(self, "phi3_same_rope", False):
            ms = self.rope_mscale
        ang = pos.astype(np.float64)[:, None] * inv[None, :]
        c, s = np.cos(ang) * ms, np.sin(ang) * ms  # [T, half]
        x64 = x.astype(np.float64)
        out = x64.copy()
        half = self.n_rot // 2
        if self.neox:
            a, b = x64[..., :half], x64[..., half:self.n_rot]
            out[..., :half] = a * c - b * s
            out[..., half:self.n_rot] = a * s + b * c
        else:
            a, b = x64[..., 0:self.n_rot:2], x64[..., 1:self.n_rot:2]
            out[..., 0:self.n_rot:2] = a * c - b * s
            out[..., 1:self.n_rot:2] = a * s + b * c
        return out.astype(np.float32)

    def _swiglu(self, h, gate, up, down):
        """SwiGLU, or GeGLU (GELU's tanh form) for Gemma."""
        g = self._mm(h, gate).astype(np.float64)
        u = self._mm(h, up).astype(np.float64)
        if self.gemma:
            a = 0.5 * g * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (g + 0.044715 * g ** 3)))
        else:
            a = g / (1.0 + np.exp(-g))
        return self._mm((a * u).astype(np.float32), down)

    def _moe(self, h, L):
        """Mixtral / Qwen3-MoE: softmax over the router's logits, the top k experts,
        their probabilities renormalized to sum 1, the experts' outputs so weighted."""
        logits = self._mm(h, L["router"]).astype(np.float64)      # [T, experts]
        out = np.zeros_like(h, dtype=np.float64)
        for t in range(h.shape[0]):
            p = np.exp(logits[t] - logits[t].max())
            p /= p.sum()
            top = np.argsort(-p, kind="stable")[:self.n_expert_used]
            w = p[top] / p[top].sum() if self.expert_norm else p[top]
            for wj, e in zip(w, top):
                y = self._swiglu(h[t:t + 1], L["gate_exps"][e], L["up_exps"][e], L["down_exps"][e])
                out[t] += wj * y[0]
        if "sh_gate_inp" in L:  # the shared expert, gated by a sigmoid per token
            g = self._mm(h, L["sh_gate_inp"]).astype(np.float64)      # [T, 1]
            out += 1.0 / (1.0 + np.exp(-g)) * self._swiglu(h, L["sh_gate"], L["sh_up"], L["sh_down"])
        return out.astype(np.float32)

    def forward(self, tokens, start_pos=None):
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if start_pos is None:
            start_pos = self.n_past
        if start_pos != self.n_past:
            if start_pos > self.n_past:
                raise ValueError(f"start_pos {start_pos} beyond cache length {self.n_past}")
            self.n_past = start_pos  # truncate the cache
        T = len(tokens)
        self._grow(start_pos + T)
        n_kv = start_pos + T
        pos = np.arange(start_pos, n_kv)
        hd, hdv, H, Hkv = self.head_dim, self.head_dim_v, self.n_head, self.n_head_kv
        group = H // Hkv
        scale = self.attn_scale or 1.0 / np.sqrt(hd)
        # causal mask over [T, n_kv]: query t (abs pos start+t) sees keys <= start+t
        mask = np.where(np.arange(n_kv)[None, :] <= pos[:, None], 0.0, -np.inf)

        x = self.tok_embd[tokens].astype(np.float32) * np.float32(self.embd_scale)
        for li, L in enumerate(self.layers):
            h = self._rmsnorm(x, L["attn_norm"])
            q = self._mm(h, L["wq"])
            k = self._mm(h, L["wk"])
            v = self._mm(h, L["wv"])
            if L["bq"] is not None:
                q = q + L["bq"]
            if L["bk"] is not None:
                k = k + L["bk"]
            if L["bv"] is not None:
                v = v + L["bv"]
            q = q.reshape(T, H, hd).transpose(1, 0, 2)        # [H, T, hd]
            k = k.reshape(T, Hkv, hd).transpose(1, 0, 2)      # [Hkv, T, hd]
            v = v.reshape(T, Hkv, hdv).transpose(1, 0, 2)
            if L["q_norm"] is not None:
                q = self._rmsnorm(q, L["q_norm"])
            if L["k_norm"] is not None:
                k = self._rmsnorm(k, L["k_norm"])
            swa = self.swa_layer[li]
            q = self._rope(q, pos, swa)
            k = self._rope(k, pos, swa)
            self.kc[li][:, start_pos:n_kv] = self._h(k)
            self.vc[li][:, start_pos:n_kv] = self._h(v)
            K = self.kc[li][:, :n_kv].astype(np.float64)
            V = self.vc[li][:, :n_kv].astype(np.float64)
            att = np.empty((H, T, hdv), np.float64)
            lmask = mask
            if swa:  # key p0 visible from query p1 when p1 - p0 < n_swa
                far = (pos[:, None] - np.arange(n_kv)[None, :]) >= self.n_swa
                lmask = np.where(far, -np.inf, mask)
            for hh in range(H):
                kvh = hh // group
                s = (self._h(q[hh]).astype(np.float64) @ K[kvh].T) * scale
                if self.attn_softcap > 0:
                    s = self.attn_softcap * np.tanh(s / self.attn_softcap)
                s = s + lmask
                s -= s.max(axis=-1, keepdims=True)
                p = np.exp(s)
                p /= p.sum(axis=-1, keepdims=True)
                att[hh] = self._h(p) @ V[kvh]
            a = att.transpose(1, 0, 2).reshape(T, H * hdv).astype(np.float32)
            o = self._mm(a, L["wo"])
            if L["bo"] is not None:
                o = o + L["bo"]
            if L["attn_post_norm"] is not None:
                o = self._rmsnorm(o, L["attn_post_norm"])
            x = x + o * np.float32(self.resid_scale)
            h = self._rmsnorm(x, L["ffn_norm"])
            if self.n_expert:
                x = x + self._moe(h, L) * np.float32(self.resid_scale)
                continue
            f = self._swiglu(h, L["gate"], L["up"], L["down"])
            if L["ffn_post_norm"] is not None:
                f = self._rmsnorm(f, L["ffn_post_norm"])
            x = x + f * np.float32(self.resid_scale)
        self.n_past = n_kv
        h = self._rmsnorm(x, self.out_norm)
        lg = self._mm(h, self.out_w) / self.logit_scale
        if self.softcap > 0:
            lg = self.softcap * np.tanh(lg / self.softcap)
        return lg.astype(np.float32)

    # ------------------------------------------------------------------ text
    def token_str(self, i):
        return self.tokens[i] if 0 <= i < len(self.tokens) else f"<?{i}>"

    def detok(self, ids, show_special=True):
        out = bytearray()
        for i in ids:
            s = self.token_str(int(i))
            tt = self.token_type[int(i)] if int(i) < len(self.token_type) else 1
            if tt in (3, 4):  # CONTROL / USER_DEFINED: literal text
                if show_special or tt == 4:
                    out += s.encode("utf-8")
                continue
            if self.tok_model == "gpt2":
                try:
                    out += bytes(_BYTE_DECODER[c] for c in s)
                except KeyError:
                    out += s.encode("utf-8")
            else:  # sentencepiece-style
                if s.startswith("<0x") and s.endswith(">") and len(s) == 6:
                    out.append(int(s[3:5], 16))
                else:
                    out += s.replace("\u2581", " ").encode("utf-8")
        return out.decode("utf-8", errors="replace")

    def eog_ids(self):
        """End-of-generation ids: eos/eot/eom from metadata plus control tokens
        whose text conventionally ends a turn."""
        ids = {self.special[k] for k in ("eos", "eot", "eom") if k in self.special}
        names = {"<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>",
                 "<|end|>", "<end_of_turn>", "</s>", "<|return|>"}
        for i, s in enumerate(self.tokens):
            if s in names and (i >= len(self.token_type) or self.token_type[i] in (3, 4)):
                ids.add(i)
        return ids

    def hf_tokenizer(self):
        """A Hugging Face `tokenizers` BPE built from the GGUF vocab + merges
        (gpt2-style vocabularies only).  Used for --self-test without kilnd."""
        from tokenizers import Tokenizer, models, pre_tokenizers, decoders, AddedToken
        r = gguf.GGUFReader(self.path)
        merges = _field(r, "tokenizer.ggml.merges", [])
        pre = _field(r, "tokenizer.ggml.pre", "default")
        vocab = {s: i for i, s in enumerate(self.tokens)}
        bpe = models.BPE(vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges])
        tok = Tokenizer(bpe)
        bl = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        if pre in ("smollm", "starcoder", "refact", "command-r", "codeshell"):
            tok.pre_tokenizer = pre_tokenizers.Sequence(
                [pre_tokenizers.Digits(individual_digits=True), bl])
        else:
            tok.pre_tokenizer = bl
        tok.decoder = decoders.ByteLevel()
        tok.add_special_tokens([AddedToken(self.tokens[i], special=True, normalized=False)
                                for i, t in enumerate(self.token_type) if t == 3])
        return tok


def load(path, verbose=False, emulate_q8=False, n_ctx=None):
    return Model(path, verbose=verbose, emulate_q8=emulate_q8, n_ctx=n_ctx)


def forward(model, tokens, start_pos=0):
    """Module-level convenience: logits for each position of `tokens`."""
    return model.forward(tokens, start_pos)


def greedy(model, prompt_ids, n, stop_ids=(), return_step_logits=False):
    """Greedy decode of up to n tokens after prompt_ids (fresh cache).

    Prefills the whole prompt in one forward, then one token per step.
    Stops after emitting a token in stop_ids (that token is included).
    Returns (ids, logits of the last prompt position) and, when
    return_step_logits, also the list of logits that chose each id."""
    model.reset()
    lg = model.forward(list(prompt_ids), 0)
    last_prompt = lg[-1].copy()
    cur = last_prompt
    ids, steps = [], []
    stop_ids = set(stop_ids)
    for _ in range(n):
        steps.append(cur)
        t = int(np.argmax(cur))
        ids.append(t)
        if t in stop_ids or len(ids) == n:
            break
        cur = model.forward([t], model.n_past)[-1]
    if return_step_logits:
        return ids, last_prompt, steps
    return ids, last_prompt


def chatml(user, system="You are a helpful AI assistant named SmolLM, trained by Hugging Face"):
    return (f"<|im_start|>system\n{system}<|im_end|>\n"
            f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--text", default=None, help="prompt text (special tokens parsed)")
    ap.add_argument("--prompt-ids", default=None, help="comma-separated prompt ids")
    ap.add_argument("-n", type=int, default=32)
    a = ap.parse_args(argv)
    m = load(a.model, verbose=True)
    if a.prompt_ids:
        ids = [int(x) for x in a.prompt_ids.replace(",", " ").split()]
    else:
        text = a.text if a.text is not None else chatml("What is the capital of France?")
        ids = m.hf_tokenizer().encode(text).ids
    t0 = time.time()
    out, _ = greedy(m, ids, a.n, stop_ids=m.eog_ids())
    dt = time.time() - t0
    print("prompt ids:", " ".join(map(str, ids)))
    print("ids:", " ".join(map(str, out)))
    print("text:", repr(m.detok(out)))
    sys.stderr.write(f"ref_llama: {len(ids)} prompt + {len(out)} generated in {dt:.2f}s\n")


if __name__ == "__main__":
    main()
