#!/usr/bin/env python3
"""Generate tests/data/tok_corpus.jsonl: one JSON string per line, the texts the tokenizer
parity test (tests/ref/tok_parity.py) encodes and decodes. Deterministic (seeded).

Usage: python3 tests/ref/gen_tok_corpus.py > tests/data/tok_corpus.jsonl
"""
import json
import random

R = random.Random(20240611)

PROSE = [
    "The quick brown fox jumps over the lazy dog.",
    "Why is the sky blue? Answer in two sentences.",
    "It was the best of times, it was the worst of times, it was the age of wisdom.",
    "In 1969, Apollo 11 landed on the Moon; Neil Armstrong's first words were famous.",
    "She said: \"I can't believe it's already 3:45 p.m.!\"",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "Mr. O'Brien's well-known half-baked co-operation plan (v2.0) failed—again…",
    "Tokenizers split text into subword units; BPE merges frequent pairs.",
    "ALL CAPS SENTENCES ARE SHOUTING, AREN'T THEY?",
    "mIxEd CaSe WoRdS aNd sTrAnGe SpElLiNgS",
    "e.g., i.e., etc., vs., a.m., p.m., Dr., Mrs.",
    "Supercalifragilisticexpialidocious antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis",
]
CONTRACTIONS = ["don't", "DON'T", "Don'T", "I'm", "I'M", "you're", "YOU'RE", "we've", "We'VE",
                "she'll", "SHE'LL", "he'd", "HE'D", "it's", "IT'S", "'s", "'t", "'re", "'ve", "'m",
                "'ll", "'d", "''", "'", "rock'n'roll", "y'all'd've", "'sup", "O'Neil's"]
CODE = [
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "#include <stdio.h>\n\nint main(void) {\n\tprintf(\"hello, %s\\n\", \"world\");\n\treturn 0;\n}\n",
    "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!(\"{:?}\", v);\n}\n",
    "const f = async (x) => { await fetch(`/api/${x}?q=1&r=2`); };\n",
    "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%son' ORDER BY id DESC;",
    "<html>\n  <body>\n    <div class=\"main\" id='x'>&nbsp;&lt;tag&gt;</div>\n  </body>\n</html>\n",
    "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfmt.Println(\"go\")\n}\n",
    "    if (x != NULL && *x == '\\0') { x++; } // comment\n        /* block */\n",
    "public static void main(String[] args) throws IOException {\n        System.out.println(args[0]);\n}",
    "#!/bin/bash\nset -euo pipefail\nfor f in *.txt; do echo \"$f\" | wc -c; done\n",
    "x = {'a': 1, \"b\": [1, 2.5, -3e10], 'c': None}\nprint(x['a'] ** 2 // 3 % 7)\n",
    "\t\tdeeply\n\t\t\tindented\n\t\t\t\ttabs\n",
    "a==b!=c<=d>=e&&f||g->h::i...j",
    "{\"key\": \"value\", \"list\": [true, false, null], \"n\": 1.5e-7}",
    "- [ ] todo\n- [x] done\n* bullet\n1. numbered\n> quote\n```python\nprint(1)\n```\n",
]
CJK = ["你好，世界！", "我爱自然语言处理。", "東京は日本の首都です。", "ひらがなとカタカナ", "한국어 텍스트입니다.",
       "中文English混合text", "漢字、かな、カナ。", "「引用」と『二重引用』", "０１２３４５６７８９", "ｆｕｌｌｗｉｄｔｈ"]
RTL = ["مرحبا بالعالم", "السلام عليكم ورحمة الله", "שלום עולם", "العربية ١٢٣ ٤٥٦", "كتاب، قلم؛ ورقة؟"]
INDIC = ["नमस्ते दुनिया", "हिन्दी भाषा बहुत सुंदर है।", "०१२३४५६७८९", "ಕನ್ನಡ", "தமிழ் மொழி", "বাংলা ভাষা"]
OTHER = ["Привет, мир!", "Ελληνικά γράμματα", "Ünïcödé çàfé naïve résumé", "Ça va? Ñandú, straße, ǅ",
         "ℕ ∀x∈ℝ: x²≥0 ∑∫√∞ ≠ ≈", "½ ¼ ¾ ² ³ ¹ Ⅻ ⅷ ①②③", "ﬁ ﬂ ﬀ ligatures", "ก ข ภาษาไทย", "Tiếng Việt có dấu"]
EMOJI = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "❤️", "🇺🇸🇯🇵", "👩🏿‍💻", "🧑‍🤝‍🧑", "🙂🙃😉", "✨🔥💯",
         "🤷‍♀️", "👋🏻👋🏼👋🏽👋🏾👋🏿", "🐍 python", "Hello 👋 world 🌍!", "1️⃣2️⃣#️⃣", "🏴󠁧󠁢󠁳󠁣󠁴󠁿"]
SPACES = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\t \t", "    \n\n    ", "a  b",
          "a   b", "a \t b", "trailing   ", "   leading", "\n\nx\n\n", " \u00a0 \u3000 ", "x\u2028y",
          "\u000b\u000c", "a\u200bb", "end with newline\n", " 1", "  1", "a 1 2  3   4"]
NUMBERS = ["0", "7", "42", "123", "1234", "12345", "3.14159", "-273.15", "1,000,000", "1e-10",
           "0xDEADBEEF", "2024-06-11", "12:34:56", "+1 (555) 123-4567", "v1.2.3", "9876543210123456789",
           "$19.99", "100%", "3/4", "10^9", "#1", "A1B2C3", "٣٤٥", "一二三"]
PUNCT = ["!!!", "???", "...", "…", "?!?!", "---", "***", "___", "~~~", "((()))", "[[[]]]", "{{}}",
         "<<>>", "@#$%^&*", "\"'\"'", "`~`", "„“”‘’", "—–-", "¿¡", "。。。", "！？", "•·°"]
URLS = ["https://example.com/path?query=1&x=y#frag", "http://localhost:8443/v1/chat",
        "user@example.org", "ftp://ftp.gnu.org/pub/gnu/", "www.kiln.dev/docs/index.html",
        "https://en.wikipedia.org/wiki/Byte_pair_encoding", "file:///etc/hosts", "git@github.com:a/b.git"]
SPECIAL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_start|>user\nHi!<|im_end|>\n",
           "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
           "<|im_start", "im_start|>", "< |im_end|>", "<|im_end |>", "<|IM_START|>", "<||im_start||>",
           "<<|im_start|>>", "<|im_start|><|im_end|>", "text<|endoftext|>more", " <|im_start|> ",
           "<repo_name>kiln<file_sep>main.c", "<filename>", "<jupyter_code>x=1", "<|endoftext", "|>",
           "<gh_stars>100", "<empty_output>", "<issue_start><issue_comment>"]


def main():
    items = []
    items += PROSE + CONTRACTIONS + CODE + CJK + RTL + INDIC + OTHER + EMOJI + SPACES
    items += NUMBERS + PUNCT + URLS + SPECIAL
    items += ["", "a", "A", "é", "\u0301", "e\u0301", "ß", "İ", "ǈ"]
    # control characters the SmolLM2 vocabulary has no byte symbol for: dropped
    items += ["!\x04!", "(\x04)", "a\x04b", "\x13\x14", "x \x1d\x16 y", "\x7f\x00\x01"]
    pools = [PROSE, CONTRACTIONS, CODE, CJK, RTL, INDIC, OTHER, EMOJI, SPACES, NUMBERS, PUNCT, URLS, SPECIAL]
    seps = ["", " ", "  ", "\n", "\t", ", ", " - "]
    while len(items) < 320:  # random mixtures
        k = R.randint(2, 5)
        parts = [R.choice(R.choice(pools)) for _ in range(k)]
        items.append("".join(p + R.choice(seps) for p in parts))
    # a long paragraph and a long run of spaces and digits
    items.append(" ".join(PROSE) * 3)
    items.append(" " * 300 + "x")
    items.append("1234567890" * 30)
    items.append("ab" * 200)
    for s in items:
        print(json.dumps(s, ensure_ascii=False))


if __name__ == "__main__":
    main()
