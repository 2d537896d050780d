#!/usr/bin/env python3
"""The model loader refuses what it does not implement, naming it (issue: "nothing that
changes results is ignored").

  strict_load.py --kilnd build/gnu/kilnd

Each case writes a small random GGUF (make_tiny_models.build, F16 matrices) with one
thing kiln does not implement, then runs `kilnd generate` and `kilnd check-config` on
it: both must exit 1 and print the words given (the key or tensor by name).  Absurd values
of single header fields (issue 24's mutations) are refused the same way.  A last
case checks that the same file without the addition loads, so a refusal is caused by
the addition and not by the base file.  Prints one line per case and
"strict load: N passed, M failed".
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_tiny_models as tm  # noqa: E402
from gguf import GGMLQuantizationType as QT  # noqa: E402

CFG = dict(d=64, layers=1, heads=2, kv_heads=1, head_dim=32, ffn=128, ctx=256,
           rope_base=1e4, eps=1e-5, sigma=0.1, embd_sigma=0.1, out_sigma=None)
F16 = lambda li: {r: QT.F16 for r in tm.ROLES}  # noqa: E731

# (name, build overrides, words both commands must print)
CASES = [
    ("unknown key", dict(meta={"bogus_knob": 1}),
     "metadata key 'llama.bogus_knob' is not implemented"),
    ("a Granite key on llama", dict(meta={"logit_scale": 2.0}),
     "metadata key 'llama.logit_scale' is not implemented"),
    ("sliding window set", dict(meta={"attention.sliding_window": 64}),
     "'llama.attention.sliding_window' is set"),
    ("experts on granite", dict(arch="granite", meta={"expert_count": 8}),
     "'granite.expert_count' is set"),
    ("experts without their tensors", dict(meta={"expert_count": 4, "expert_used_count": 2}),
     "tensor 'blk.0.ffn_gate_inp.weight' is missing"),
    ("sigmoid expert gating", dict(meta={"expert_gating_func": 2}),
     "'llama.expert_gating_func' is not 1"),
    ("qwen3moe without experts", dict(arch="qwen3moe", qk_norm=True),
     "qwen3moe without qwen3moe.expert_count"),
    ("longrope scaling", dict(meta={"rope.scaling.type": "longrope"}),
     "RoPE scaling 'longrope' is not implemented"),
    ("value heads differ", dict(meta={"attention.value_length": 16}),
     "value heads of 16 differ from key heads of 32"),
    ("unused tensor", dict(extra_tensors={"blk.0.attn_output.bias": np.zeros(64)}),
     "tensor 'blk.0.attn_output.bias' is not used"),
    ("unknown architecture", dict(arch="phi2"), "architecture 'phi2' is not supported"),
    ("gemma2 without post-norms", dict(arch="gemma2"), "tensor 'blk.0.post_attention_norm.weight' is missing"),
    ("an output matrix on gemma2", dict(arch="gemma2", post_norms=True, out_type=QT.F16,
                                        cfg=dict(CFG, out_sigma=0.1)),
     "tensor 'output.weight' is not used"),
    ("a Gemma key on llama", dict(meta={"attention.sliding_window_pattern": 6}),
     "metadata key 'llama.attention.sliding_window_pattern' is not implemented"),
    ("gemma3 without post-norms", dict(arch="gemma3", qk_norm=True),
     "tensor 'blk.0.post_attention_norm.weight' is missing"),
    ("qwen3 without q/k norms", dict(arch="qwen3"), "tensor 'blk.0.attn_q_norm.weight' is missing"),
    ("non-positive RoPE factor", dict(rope_freqs=np.zeros(16)), "rope_freqs.weight[0] is 0"),
    # absurd headers (issue 24's single-field mutations of a GGUF)
    ("rms epsilon -1", dict(cfg=dict(CFG, eps=-1.0)), "layer_norm_rms_epsilon -1 is not in (0, 1)"),
    ("rope dimension 0", dict(cfg=dict(CFG, rope_dim=0)), "rope_dim 0"),
    ("rope base NaN", dict(cfg=dict(CFG, rope_base=float("nan"))), "rope.freq_base' is not finite"),
    ("rope base -5", dict(cfg=dict(CFG, rope_base=-5.0)), "rope.freq_base -5 must be above 1"),
    ("vocab_size off", dict(meta={"vocab_size": 7}), "vocab_size 7 differs from token_embd.weight's 512 rows"),
    ("file_type 999", dict(general={"file_type": 999}), "general.file_type is not a known file type"),
    ("bos out of range", dict(bos=512), "a special token id outside the vocabulary: tokenizer.ggml.bos_token_id"),
    ("token type 99", dict(tok_edit=lambda v, t, m: (v, [99] + t[1:], m)), "a type outside 1..6"),
    ("a merge without a space", dict(tok_edit=lambda v, t, m: (v, t, m[:5] + ["ab"] + m[5:])),
     "a merge that is not two parts around a space"),
    ("LongRoPE long factors only", dict(arch="phi3", fused=True, extra_tensors={"rope_factors_long.weight": np.ones(16)}),
     "rope_factors_long without rope_factors_short"),
]


def write(path, **over):
    spec = dict(arch="llama", cfg=CFG, types_for_layer=F16, embd_type=QT.F16, out_type=None,
                norm_kinds=("F32", "F32", "F32"), biases=False)
    spec.update(over)
    tm.build(path, rng=np.random.default_rng(7), **spec)


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    return p.returncode, p.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kilnd", required=True)
    a = ap.parse_args()
    passed = failed = 0
    with tempfile.TemporaryDirectory() as td:
        def check(tag, path, words, want_rc):
            nonlocal passed, failed
            for verb in ("generate", "check-config"):
                cmd = [a.kilnd, verb, "--model", path]
                cmd += ["--prompt-ids", "1,2,3", "--max-tokens", "1"] if verb == "generate" else []
                rc, out = run(cmd)
                ok = rc == want_rc and (words is None or words.lower() in out.lower())
                if want_rc == 0 and verb == "check-config":
                    # without TLS files check-config stops after the model: the model
                    # part passed when the message is about something else
                    ok = "model:" not in out
                passed += ok
                failed += not ok
                print(f"{'PASS' if ok else 'FAIL'} {tag} ({verb}): rc {rc}; "
                      f"{out.strip().splitlines()[-1][:160] if out.strip() else '(no output)'}")
        for i, (tag, over, words) in enumerate(CASES):
            path = os.path.join(td, f"case{i}.gguf")
            write(path, **over)
            check(tag, path, words, 1)
        base = os.path.join(td, "base.gguf")
        write(base)
        check("the base file loads", base, None, 0)
        # a chat template kiln cannot render: the model loads and serves plain prompts,
        # check-config warns, and a chat request gets a clear error, not a guess
        junk = os.path.join(td, "junk-template.gguf")
        write(junk, chat_template="{% for m in messages %}<<{{ m.content }}>>{% endfor %}")
        rc, out = run([a.kilnd, "check-config", "--model", junk])
        ok = "chat template is not one kiln knows" in out and "model:" not in out
        rc2, out2 = run([a.kilnd, "generate", "--model", junk, "--chat", "--prompt", "hi", "--max-tokens", "1"])
        ok2 = rc2 != 0 and "template" in out2
        rc3, _ = run([a.kilnd, "generate", "--model", junk, "--prompt-ids", "1,2,3", "--max-tokens", "1"])
        for tag, good, o in (("an unknown chat template: check-config warns", ok, out),
                             ("an unknown chat template: a chat request fails, saying why", ok2, out2),
                             ("an unknown chat template: plain prompts still run", rc3 == 0, "")):
            passed += good
            failed += not good
            print(f"{'PASS' if good else 'FAIL'} {tag}; {o.strip().splitlines()[-1][:160] if o.strip() else ''}")
    print(f"strict load: {passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
