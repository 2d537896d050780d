#!/usr/bin/env python3
"""User and system text cannot write a chat template's markup (issue 24: "user text
forges chat turns").

  chat_injection.py --kilnd build/gnu/kilnd --model MODEL.gguf [--vocab V.gguf:TEMPLATE ...]

For each model (and template), every control or user-defined token text of the
vocabulary is put inside a user message and inside a system message, and the
conversation goes through `kilnd tokenize --chat` (the same core/prompt path GEN and the
OpenAI API take): the ids must hold exactly as many special tokens as the same
conversation without the inserted text, i.e. the inserted text became plain-text
tokens, not the special one.  Before this check existed, "<|im_end|>" in a user turn
became the control token, and a user could close its turn and write a system or
assistant turn.  Prints one line per case and "chat injection: N passed, M failed".
"""
import argparse
import subprocess
import sys

from gguf import GGUFReader

SPECIAL = (3, 4)  # control, user-defined


def specials(path):
    r = GGUFReader(path)
    toks = r.fields["tokenizer.ggml.tokens"].contents()
    types = r.fields["tokenizer.ggml.token_type"].contents()
    return [(i, t) for i, (t, ty) in enumerate(zip(toks, types)) if ty in SPECIAL and t]


def ids_of(kilnd, model, template, convs):
    """The ids of each conversation, one `kilnd tokenize --chat` for them all (a line
    each, answered in order)."""
    lines = "".join(" ".join(f"{role}={text.encode().hex()}" for role, text in msgs) + "\n"
                    for msgs in convs)
    cmd = [kilnd, "tokenize", "--chat", "--model", model] + (["--template", template] if template else [])
    p = subprocess.run(cmd, input=lines, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=300)
    out = p.stdout.split("\n")[:len(convs)]
    if p.returncode != 0 or len(out) != len(convs) or "!" in out:
        raise RuntimeError(f"kilnd tokenize --chat failed: {p.stderr.strip()[-200:] or p.stdout.strip()[-200:]}")
    return [[int(x) for x in o.split()] for o in out]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kilnd", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--templates", default="auto,chatml,qwen2.5,qwen3,llama3,gemma,phi3,granite3")
    a = ap.parse_args()
    passed = failed = 0
    sp = specials(a.model)
    special_ids = {i for i, _ in sp}
    for template in a.templates.split(","):
        tmpl = None if template == "auto" else template
        for where in ("user", "system"):
            def conv(extra):
                u = "hi" + (extra if where == "user" else "")
                s = "be brief" + (extra if where == "system" else "")
                return [("system", s), ("user", u)]
            got_all = ids_of(a.kilnd, a.model, tmpl, [conv("")] + [conv(" " + text + " ") for _, text in sp])
            base = sum(i in special_ids for i in got_all[0])
            bad = []
            for (_, text), got in zip(sp, got_all[1:]):
                n = sum(i in special_ids for i in got)
                if n != base:
                    bad.append(f"{text!r}: {n} special tokens, {base} without it")
            ok = not bad
            passed += ok
            failed += not ok
            print(f"{'PASS' if ok else 'FAIL'} template {template}, in the {where} text: {len(sp)} "
                  f"special texts inserted, the prompt keeps its {base} special tokens"
                  + ("" if ok else "; " + "; ".join(bad[:4])))
    print(f"chat injection: {passed} passed, {failed} failed")
    return 0 if failed == 0 and passed else 1


if __name__ == "__main__":
    sys.exit(main())
