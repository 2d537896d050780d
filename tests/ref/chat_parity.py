#!/usr/bin/env python3
"""Chat-template parity: core/chat's C renderings against the models' own Jinja templates.

The templates are the ones llama.cpp keeps in its source tree (models/templates/*.jinja,
the chat_template of its phi-3 test vocabulary, and Phi-4's among the C strings of
tests/test-chat-template.cpp), taken from the pinned
llama-cpp-python sdist by tests/ref/vocabs.sh. Each is rendered with Jinja2 the way
Hugging Face's apply_chat_template does (a sandboxed environment with trim_blocks and
lstrip_blocks, raise_exception, strftime_now, tojson) over a set of conversations:
1 to 4 turns, with and without a system message, unicode, whitespace at both ends,
reasoning blocks, tool results, roles that do not alternate; with and without the
generation prompt. `kilnd tokenize --chat --render` renders the same conversations with
the kind kiln detects from the template file; the bytes must be identical, and where
the template raises, kiln must refuse too. The default system message a template sets
(Mistral's) kiln reads from the template file, as it does from a GGUF's. The one deliberate difference: Gemma 2's
template refuses a system message, kiln folds it into the first user turn as Gemma 3's
does; those conversations are counted apart, not compared.

--tree: also every other template in the folder that kiln claims to know (its detection
says a kind) is compared the same way, and listed with its count. A template kiln
misreads fails the test, except those in MISREAD: kiln's older fallbacks (any other
template with <|im_start|> is rendered as plain ChatML, any other with
<|start_header_id|> as Llama 3), listed so that a new misreading cannot hide among them.

Usage: chat_parity.py --kilnd build/gnu/kilnd --fetch tests/ref/vocabs.sh [--tree]
Exits 1 on any difference in the named templates (and with --tree, in any claimed one).
"""
import argparse
import datetime
import json
import os
import subprocess
import sys

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

NOW = 1764676800  # 2025-12-02 12:00 UTC: the date Granite and Llama 3.2 print (the same day in most zones)

# (template, the kind kiln must detect, special-token texts the template reads, extra vars)
CASES = [
    ("templates/Qwen-Qwen3-0.6B.jinja", "qwen3", {}, {}),
    ("templates/Qwen-Qwen3-0.6B.jinja", "qwen3-nothink", {}, {"enable_thinking": False}),
    ("templates/google-gemma-2-2b-it.jinja", "gemma", {"bos_token": "<bos>", "eos_token": "<eos>"}, {}),
    ("templates/microsoft-Phi-3.5-mini-instruct.jinja", "phi3", {"bos_token": "<s>", "eos_token": "<|endoftext|>"}, {}),
    ("gguf:ggml-vocab-phi-3.gguf", "phi3-legacy", {"bos_token": "<s>", "eos_token": "<|endoftext|>"}, {}),
    ("cpp:phi-4", "phi4", {}, {}),
    ("templates/mistralai-Mistral-Nemo-Instruct-2407.jinja", "mistral-tekken", {"bos_token": "<s>", "eos_token": "</s>"}, {}),
    ("templates/ibm-granite-granite-3.3-2B-Instruct.jinja", "granite3", {}, {}),
    # Mistral's [SYSTEM_PROMPT] templates; the default system messages (Small 3.2's with
    # today's date) kiln reads from the template itself (--template-file)
    ("templates/Mistral-Small-3.2-24B-Instruct-2506.jinja", "mistral-small3", {"bos_token": "<s>", "eos_token": "</s>"}, {}),
    ("templates/unsloth-mistral-Devstral-Small-2507.jinja", "devstral", {"bos_token": "<s>", "eos_token": "</s>"}, {}),
    ("templates/mistralai-Ministral-3-14B-Reasoning-2512.jinja", "ministral3", {"bos_token": "<s>", "eos_token": "</s>"}, {}),
    ("templates/google-gemma-4-31B-it.jinja", "gemma4", {"bos_token": "<bos>", "eos_token": "<eos>"}, {}),
    ("templates/google-gemma-4-31B-it-interleaved.jinja", "gemma4-interleaved", {"bos_token": "<bos>", "eos_token": "<eos>"}, {}),
    # the kinds kiln had before, on the real templates that are in the tree
    ("templates/Qwen-Qwen2.5-7B-Instruct.jinja", "qwen2.5", {}, {}),
    ("templates/meta-llama-Llama-3.1-8B-Instruct.jinja", "llama3.1", {"bos_token": "<|begin_of_text|>"}, {}),
    ("templates/meta-llama-Llama-3.3-70B-Instruct.jinja", "llama3.1", {"bos_token": "<|begin_of_text|>"}, {}),
    ("templates/meta-llama-Llama-3.2-3B-Instruct.jinja", "llama3.2", {"bos_token": "<|begin_of_text|>"}, {}),
]
# Templates kiln's fallbacks render approximately (ChatML / Llama 3 for anything with their
# markers); known, not yet told apart. Anything else kiln claims must render identically.
MISREAD = {
    "Bielik-11B-v3.0-Instruct.jinja", "HuggingFaceTB-SmolLM3-3B.jinja", "LFM2-8B-A1B.jinja",
    "LFM2.5-8B-A1B.jinja", "LFM2.5-Instruct.jinja", "MiMo-VL.jinja", "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja",
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
    "Qwen-QwQ-32B.jinja", "Qwen3-Coder.jinja", "Qwen3.5-4B.jinja", "StepFun3.5-Flash.jinja",
    "fireworks-ai-llama-3-firefunction-v2.jinja", "meetkai-functionary-medium-v3.1.jinja",
    "meetkai-functionary-medium-v3.2.jinja", "openbmb-MiniCPM5-1B.jinja",
}
# special-token texts by kind, for --tree (a template names them through bos_token/eos_token)
KIND_TOKENS = {
    "gemma": {"bos_token": "<bos>", "eos_token": "<eos>"},
    "phi3": {"bos_token": "<s>", "eos_token": "<|endoftext|>"},
    "phi3-legacy": {"bos_token": "<s>", "eos_token": "<|endoftext|>"},
    "mistral-tekken": {"bos_token": "<s>", "eos_token": "</s>"},
    "mistral-small3": {"bos_token": "<s>", "eos_token": "</s>"},
    "devstral": {"bos_token": "<s>", "eos_token": "</s>"},
    "ministral3": {"bos_token": "<s>", "eos_token": "</s>"},
    "gemma4": {"bos_token": "<bos>", "eos_token": "<eos>"},
    "gemma4-interleaved": {"bos_token": "<bos>", "eos_token": "<eos>"},
    "llama3": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "llama3.1": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "llama3.2": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
}


def conversations():
    """(messages, note) pairs: the conversations every template is rendered on."""
    S = {"role": "system", "content": "You are terse.\n"}
    U = [{"role": "user", "content": c} for c in
         ["Hello!", "  What is 2+2?\n\n", "\t\u3000Why? \u00a0", "日本語で答えて 🚀", "", "line one\nline two"]]
    A = [{"role": "assistant", "content": c} for c in
         ["Hi there.", "  4  \n", "\u2003spaced\u2003", "<think>\nI add.\n</think>\n\n4", "ok"]]
    convs = [
        ([U[0]], "one user turn"),
        ([S, U[0]], "system + user"),
        ([U[0], A[0], U[1]], "three turns"),
        ([S, U[0], A[0], U[1]], "system + three turns"),
        ([U[2], A[1], U[3], A[2]], "four turns, whitespace and unicode"),
        ([S, U[3]], "unicode"),
        ([U[4]], "empty user text"),
        ([{"role": "system", "content": ""}, U[0]], "empty system text"),
        ([U[5], A[3]], "an answer with its reasoning (last turn)"),
        ([U[0], A[3], U[1]], "reasoning in an earlier turn"),
        ([U[1], A[3], U[2], A[4]], "reasoning before the last query"),
        ([{"role": "system", "content": "  padded system  "}, U[1], A[1]], "system with spaces, ends on assistant"),
        ([U[0], {"role": "tool", "content": "42"}, {"role": "tool", "content": "43"}], "tool results"),
        ([U[0], {"role": "user", "content": "<tool_response>\n7\n</tool_response>"}, A[4]], "a user turn that is a tool response"),
        ([U[0], U[1]], "two user turns in a row"),
        ([A[0], U[0]], "assistant first"),
        ([S, {"role": "system", "content": "second system"}, U[0]], "two system messages"),
    ]
    return convs


def env():
    e = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                      extensions=["jinja2.ext.loopcontrols"])

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.fromtimestamp(NOW).strftime(fmt)

    e.filters["tojson"] = tojson
    e.globals["raise_exception"] = raise_exception
    e.globals["strftime_now"] = strftime_now
    return e


def cpp_template(path, name):
    """The template_str of the test named name in test-chat-template.cpp (a C string)."""
    import ast
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    for i, line in enumerate(lines):
        if line.strip() == '/* .name= */ "%s",' % name:
            s = lines[i + 1].strip()
            prefix = "/* .template_str= */ "
            if s.startswith(prefix) and s.endswith(","):
                return ast.literal_eval(s[len(prefix):-1])  # C's escapes here are Python's too
    sys.exit("chat_parity: no template %r in %s" % (name, path))


def template_text(folder, src):
    if src.startswith("cpp:"):
        return cpp_template(os.path.join(folder, "templates", "test-chat-template.cpp"), src[4:])
    if src.startswith("gguf:"):
        from gguf import GGUFReader
        return GGUFReader(os.path.join(folder, src[5:])).fields["tokenizer.chat_template"].contents()
    with open(os.path.join(folder, src), encoding="utf-8") as f:
        return f.read()


def jinja_render(tmpl, messages, agp, tokens, extra):
    try:
        return tmpl.render(messages=messages, add_generation_prompt=agp, **tokens, **extra).encode()
    except (jinja2.exceptions.TemplateError, TypeError, AttributeError, KeyError, IndexError):
        return None  # raise_exception, undefined values used, a message shape it cannot take


def kiln(kilnd, args, lines):
    p = subprocess.run([kilnd, "tokenize", "--chat", "--now", str(NOW)] + args, input="".join(lines).encode(),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if p.returncode != 0:
        sys.exit("chat_parity: kilnd %s: %s" % (" ".join(args), p.stderr.decode(errors="replace").strip()))
    return p.stdout.decode().split("\n")


def conv_line(messages):
    return " ".join("%s=%s" % (m["role"], m["content"].encode().hex()) for m in messages) + "\n"


def compare(kilnd, name, text, kind, tokens, extra, tmpfile, verbose=True):
    """(identical, differing, skipped) over every conversation, with and without the
    generation prompt."""
    with open(tmpfile, "w", encoding="utf-8") as f:
        f.write(text)
    detected = kiln(kilnd, ["--template-file", tmpfile, "--detect"], [])[0]
    kind = kind or detected
    try:
        tmpl = env().from_string(text)
    except jinja2.exceptions.TemplateSyntaxError as e:  # e.g. transformers' {% generation %} tag
        print("%s: Jinja2 cannot read it: %s" % (name, e))
        return 0, 0, 0, kind
    same = diff = skipped = 0
    if kind != detected and not kind.startswith(detected):  # qwen3-nothink: a rendering option of qwen3
        print("%s: kiln detects %s, not %s" % (name, detected, kind))
        diff += 1
    convs = conversations()
    for agp in (True, False):
        args = ["--render", "--template", kind, "--template-file", tmpfile] + ([] if agp else ["--no-generation-prompt"])
        got = kiln(kilnd, args, [conv_line(m) for m, _ in convs])
        for (msgs, note), line in zip(convs, got):
            want = jinja_render(tmpl, msgs, agp, tokens, extra)
            have = None if line == "!" else bytes.fromhex(line)
            if want is None and kind == "gemma" and msgs[0]["role"] == "system" and have is not None:
                skipped += 1  # Gemma 2 refuses a system message; kiln folds it as Gemma 3 does
                continue
            if want == have:
                same += 1
                continue
            diff += 1
            if verbose:
                print("%s (%s) [%s, generation prompt %s]:\n  jinja %r\n  kiln  %r" %
                      (name, kind, note, agp, want if want is None else want.decode(),
                       have if have is None else have.decode(errors="replace")))
    return same, diff, skipped, kind


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kilnd", required=True)
    ap.add_argument("--fetch", required=True, help="tests/ref/vocabs.sh")
    ap.add_argument("--tree", action="store_true", help="also every template kiln claims to know")
    args = ap.parse_args()
    p = subprocess.run([args.fetch, "--templates", "phi-3"], stdout=subprocess.PIPE)
    if p.returncode != 0:
        sys.exit("chat_parity: %s failed" % args.fetch)
    folder = p.stdout.decode().strip().split("\n")[-1]
    tmpfile = os.path.join(folder, ".chat_parity.jinja")
    bad = 0
    done = set()
    for src, kind, tokens, extra in CASES:
        text = template_text(folder, src)
        done.add(src)
        same, diff, skipped, kind = compare(args.kilnd, src, text, kind, tokens, extra, tmpfile)
        print("%s as %s: %d of %d identical%s" % (src, kind, same, same + diff,
                                                 ", %d refused by the template and folded by kiln" % skipped if skipped else ""))
        bad += diff > 0
    if args.tree:
        for fn in sorted(os.listdir(os.path.join(folder, "templates"))):
            src = "templates/" + fn
            if not fn.endswith(".jinja") or src in done:
                continue
            text = template_text(folder, src)
            with open(tmpfile, "w", encoding="utf-8") as f:
                f.write(text)
            kind = kiln(args.kilnd, ["--template-file", tmpfile, "--detect"], [])[0]
            if kind == "unknown":
                continue
            same, diff, skipped, kind = compare(args.kilnd, src, text, kind, KIND_TOKENS.get(kind, {}), {}, tmpfile,
                                                verbose=False)
            known = fn in MISREAD
            print("tree: %s as %s: %d of %d identical%s" % (src, kind, same, same + diff,
                                                            " (a known misreading)" if known and diff else ""))
            bad += diff > 0 and not known
    os.unlink(tmpfile)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
