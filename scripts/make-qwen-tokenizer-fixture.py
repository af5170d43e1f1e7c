#!/usr/bin/env python3
"""Writes tests/fixtures/worker/qwen_tokenizer_cases.jsonl and qwen_manifest.jsonl.

Run once by hand, never by the tests (they only read the fixtures):

    scripts/fetch-model.sh qwen2.5-coder-0.5b
    python3 -m venv ~/.cache/polykv/ref-venv
    ~/.cache/polykv/ref-venv/bin/pip install gguf==0.19.0 tokenizers==0.23.3 numpy
    ~/.cache/polykv/ref-venv/bin/python scripts/make-qwen-tokenizer-fixture.py

The reference is independent of our C++ and of transformers: a Hugging Face
`tokenizers` Tokenizer built from the GGUF's OWN vocabulary and merges (read
with gguf-py), configured as Qwen2's tokenizer.json is:
  normalizer     NFC
  pre_tokenizer  Sequence[Split(<QWEN2_SPLIT>, Isolated),
                          ByteLevel(add_prefix_space=False, trim_offsets=False,
                                    use_regex=False)]
  decoder        ByteLevel
  added tokens   every control (3) and user-defined (4) token, special,
                 matched before normalization.
Each row is {"text", "ids", "decoded"}: ids from encode() (added tokens parsed),
decoded from decode(ids, skip_special_tokens=False), which is NFC(text).
The strings are seeded and deterministic; the manifest records the versions.

Unicode versions differ: the reference's regex engine (Oniguruma) has Unicode
16.0 classes, its NFC (unicode-normalization-alignments) Unicode 9.0 data,
while our C++ tables come from Python's unicodedata (14.0 here). The random
strings avoid the code points where the three disagree (found by probing the
reference; the manifest counts them); the curated strings never hit them.
"""
import hashlib
import json
import os
import random
import sys
import unicodedata

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from qwen2_hf_tokenizer import QWEN2_SPLIT, qwen2_tokenizer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "worker")
MODEL_FILE = "Qwen2.5-Coder-0.5B-Instruct.gguf"
SEED = 20261201


def model_path():
    d = os.environ.get("POLYKV_MODEL_DIR", os.path.expanduser("~/.cache/polykv/models"))
    return os.path.join(d, MODEL_FILE)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def write_jsonl(name, rows):
    path = os.path.join(OUT, name)
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=True, separators=(",", ":")) + "\n")
    print(f"wrote {path} ({len(rows)} rows, {os.path.getsize(path)} bytes)", file=sys.stderr)


def reference_tokenizer(path):
    from gguf import GGUFReader
    r = GGUFReader(path)
    field = lambda k: r.fields[k].contents()
    assert field("tokenizer.ggml.model") == "gpt2" and field("tokenizer.ggml.pre") == "qwen2"
    tokens = field("tokenizer.ggml.tokens")
    types = field("tokenizer.ggml.token_type")
    merges = field("tokenizer.ggml.merges")
    tok = qwen2_tokenizer(tokens, types, merges)
    return tok, len(tokens), len(merges), sum(1 for t in types if t in (3, 4))


# ---------------------------------------------------------------- strings

CODE = [
    "def add(a, b):\n    return a + b\n",
    "class Cache:\n    def __init__(self, n: int) -> None:\n        self.n = n  # pages\n",
    "if __name__ == \"__main__\":\n\tmain()\n",
    "import os, sys\nfrom typing import List, Dict\n\n\ndef f(xs: List[int]) -> Dict[str, int]:\n"
    "    return {str(x): x**2 for x in xs if x % 2 == 0}\n",
    "    \n    \n        pass   \n",
    "try:\r\n    x = 1\r\nexcept Exception as e:\r\n    raise\r\n",
    "const f = async (u) => {\n  const r = await fetch(u);\n  return r.json();\n};",
    "export default function App() {\n  return <div className=\"app\">{items.map(i => <Item key={i.id} />)}</div>;\n}",
    "let x = [1, 2, 3].filter((v) => v > 1); // => [2, 3]",
    "console.log(`value: ${obj?.a ?? 'none'}`);",
    "#include <vector>\n#include <string>\n\nint main() {\n\tstd::vector<int> v{1, 2, 3};\n"
    "\tfor (auto& x : v) x *= 2;\n\treturn 0;\n}\n",
    "template <typename T>\nT max(T a, T b) { return a > b ? a : b; }",
    "absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::FromGguf(*file);",
    "std::map<std::string, int>::const_iterator it = m.find(\"key\");",
    "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!(\"{:?}\", v);\n}\n",
    "impl<'a> Iterator for Tokens<'a> {\n    type Item = &'a str;\n}",
    "#[derive(Debug, Clone)]\npub struct Page { id: u64, refs: usize }",
    "match x {\n    Some(v) => v,\n    None => return Err(\"none\".into()),\n}",
    "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfmt.Println(\"hello, 世界\")\n}\n",
    "func (s *Server) Start(ctx context.Context) error {\n\tif err := s.listen(); err != nil {\n"
    "\t\treturn fmt.Errorf(\"listen: %w\", err)\n\t}\n\treturn nil\n}",
    "SELECT id, name FROM users WHERE age >= 21 ORDER BY name DESC LIMIT 10;",
    "$ ls -la /tmp && echo \"done\" | grep -v '^#' > out.txt 2>&1",
    "<html>\n  <body>\n    <p class='x'>Hi</p>\n  </body>\n</html>",
    "x = lambda a, b: a if a > b else b  # max\n",
    "a[i][j] += b[j][k] * c[k][i];",
    "0x1F 0b1010 1_000_000 3.14e-10 -42 +7 0o777",
    "@@ -1,3 +1,4 @@\n-old line\n+new line\n context\n",
    "\\n \\t \\\\ \\\" \\u00e9",
    "### Heading\n- item 1\n- item 2\n\n```python\nprint('hi')\n```\n",
    "// TODO(alice): don't forget the edge case.\n/* multi\n * line\n */",
]
JSON_TOOL = [
    "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}",
    "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"kv cache\"}}\n</tool_call>",
    "<tool_response>\n{\"temp\": 21.5, \"ok\": true, \"tags\": [\"a\", \"b\"], \"x\": null}\n</tool_response>",
    "{\"key\": [1, 2.5, -3e10], \"nested\": {\"a\": null, \"b\": {}}}",
    "[{\"id\":1,\"v\":\"x\"},{\"id\":2,\"v\":\"y\"}]",
    "{\n  \"version\": \"1.2.3\",\n  \"deps\": {\n    \"numpy\": \">=1.26\"\n  }\n}\n",
    "Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\nZeroDivisionError: division by zero",
    "3 passed, 1 failed: test_io (timeout) in 0.42s",
    "path/to/file_name.py:123:45: error: undefined name 'foo' [F821]",
    "total 12\ndrwxr-xr-x  2 root root 4096 Dec  1 08:20 .\n-rw-r--r--  1 root root  491400064 model.gguf",
    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 42\r\n\r\n{}",
    "id,name,score\r\n1,alice,9.5\r\n2,bob,7\r\n",
    "key=value; other='quoted value'; n=42",
    "ERROR 2026-12-01T08:24:24Z [worker] RESOURCE_EXHAUSTED: pool full (used 1024/1024 pages)",
]
UNICODE = [
    "café", "naïve", "Ångström", "straße", "Привет, мир!", "Ελληνικά", "日本語のテキスト",
    "中文字符测试，标点。", "한국어 문장입니다", "العربية ٣٤٥", "עברית", "हिन्दी", "ไทย", "Tiếng Việt",
    "東京都渋谷区", "ｆｕｌｌｗｉｄｔｈ　ＡＢＣ", "ｶﾀｶﾅ", "「引用」『二重』", "你好世界！", "こんにちは、世界。",
    "😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "👩🏾‍💻", "🇫🇷🇯🇵", "1️⃣", "❤️", "🤖🚀✨", "☕️",
    "∑∫√∞≠≈", "→⇒↔", "½ ¾ ⅓", "x² y³ z⁴", "Ⅻ Ⅳ", "①②③", "𝟙𝟚𝟛", "٠١٢٣", "१२३", "™©®",
    "€£¥₹", "“quoted” ‘single’", "«guillemets»", "—–-", "…", "\u200b", "\u200d", "\ufeff",
    "〇", "ǅ", "ʰ", "ᴬ", "ﬁ", "𝔘𝔫𝔦", "İ", "ı", "ŉ", "ſ", "Ω", "K",
]
# Strings NFC changes (decomposed, reordered, singletons, excluded composites).
NFC_CHANGES = [
    "e\u0301", "E\u0301", "cafe\u0301", "A\u030a", "a\u0308o\u0308u\u0308", "n\u0303",
    "\u1100\u1161", "\u1100\u1161\u11a8", "\u1112\u1161\u11ab\u1100\u1173\u11af",
    "\uac00\u11a8", "\u1112\u1161\u11ab \uae00", "a\u0301\u0327", "a\u0327\u0301",
    "\u212b", "\u2126", "\u212a", "\u0344", "\u0958", "\u0343", "\u0374", "\u037e", "\u0387",
    "e\u0323\u0302", "\u1ebf", "\u00c7\u0301", "C\u0327\u0301", "\u03b1\u0313\u0301\u0345",
    "\u1e0b\u0323", "d\u0323\u0307", "q\u0307\u0323", "o\u031b\u0323", "\u01d5",
    "u\u0308\u0304", "\u0041\u030a\u0301", "\u0b47\u0b3e", "\u0b47\u0b57", "\u09c7\u09be",
    "\u0915\u093c", "\u1e9b\u0323", "\u017f\u0323\u0307", "\u0061\u0335\u0301",
    "\u00e9\u0301", "x\u0301\u0301", "\u0301", " \u0301", "\u0301e", "\u3099\u304b",
    "\u304b\u3099", "\u30cf\u309a", "\uf900", "\uf9ff", "\u2000", "\u2001", "\u1fef",
    "\u0300\u0301\u0302", "Zo\u0308e\u0308", "Vi\u00ea\u0323t Nam", "Vie\u0302\u0323t",
]
WHITESPACE = [
    " ", "  ", "   ", "    ", "        ", "\t", "\t\t", "\n", "\n\n", "\n\n\n", "\r\n",
    "\r\n\r\n", "\r", " \n", "\n ", " \t ", "\u00a0", "\u3000", "\u2009", "\u0085",
    "\u2028", "\u000b", "\u000c", " \u00a0 ", "\n    ", "\n\t", "  \n  ", "\t\n\t",
    " \r\n ", "   \r\n", "\n\n    ", "\r\r\n",
]
CONTRACTIONS = [
    "don't", "DON'T", "Don'T", "I'm", "I'M", "I'Ve", "i'VE", "they'll", "THEY'LL",
    "they'Ll", "we've", "WE'RE", "we'Re", "she'd", "SHE'D", "it's", "IT'S", "it'S",
    "You're", "'S", "'s", "'t", "'T", "'ll", "'LL", "'lL", "'re", "'rE", "'ve", "'VE",
    "'m", "'M", "'d", "'D", "'ſ", "rock'n'roll", "o'clock", "y'all", "'", "''", "'''",
    "'sup", "'Tis", "'em", "x'y", "5's", " 's", "\n's", "('s)",
]
SPECIALS = [
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_call>",
    "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>", "<|file_sep|>",
    "<|repo_name|>", "<|object_ref_start|>", "<|vision_start|>", "<|image_pad|>",
    "<|im_start|>user\nhello<|im_end|>\n",
    "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    "<|im_end|>\n<|im_start|>user\nWrite a sort.<|im_end|>\n<|im_start|>assistant\n",
    "<|fim_prefix|>def f(x):\n    <|fim_suffix|>\n    return y<|fim_middle|>",
    "<|repo_name|>polykv\n<|file_sep|>client/worker/tokenizer.cc\n#include <string>",
    "<|im_sta", "<|im_end", "<<|im_end|>>", "<|im_start|><|im_start|>", "text<|endoftext|>more",
    "e<|im_end|>\u0301", "<tool_call><tool_call>", " <|im_end|> ", "\n<|im_end|>\n",
    "<|IM_END|>", "<|im_end |>", "</tool_call>\n<|im_end|>",
]
NUMBERS = [
    "12345", "1234567890", "3.14159", "1,000,000", "2026-12-01", "10:45:00", "v1.2.3",
    "1e-5", "007", "  42", " 9", "x1y2z3", "100%", "$5.99", "#1", "1st 2nd 3rd", "1/2",
    "１２３", "٣٤٥٦", "²³", "0.000001", "-273.15", "192.168.0.1", "0xDEADBEEF", "a1b22c333",
]
PUNCT = [
    "...", "!!!", "?!\r\n", " ?!\r\n\r\n", "(foo)", "'hello'", "\"quoted\"", "#include", "-->",
    "===", " === \n", "::", "->", "=>", "&&", "||", "!=", "<=>", "/**", "*/", ";\n", "};\n\n",
    ")\n\n\n", " {\n", ".\n", ",\r\n", "@", "@@", "`", "```", "~/", "%d", "\\", "//", "#!",
]
WORDS = ("the quick brown fox jumps over lazy dog agent cache page token model attention "
         "layer memory daemon pool session kernel eviction budget tool call plan step result "
         "error return value function class import Hello World QWEN Coder").split()
CONTROL = ["\x00", "\x04", "\x1b[31mred\x1b[0m", "\x7f", "\x01\x02\x03"]


def divergent_code_points():
    """Code points whose class or NFC behaviour differs between the reference
    and Python's unicodedata (see the module docstring)."""
    from tokenizers import Regex, normalizers, pre_tokenizers
    cps = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    s = "".join(map(chr, cps))
    out = set()
    for pat, cat in [(r"\p{L}", "L"), (r"\p{N}", "N")]:
        unmatched = set()  # "removed" keeps what the class does not match.
        for _, (a, b) in pre_tokenizers.Split(Regex(pat), "removed").pre_tokenize_str(s):
            unmatched.update(range(a, b))
        out |= {cps[i] for i in range(len(cps))
                if (i not in unmatched) != unicodedata.category(s[i]).startswith(cat)}
    nfc = normalizers.NFC()
    for c in cps:
        ch = chr(c)
        probes = ["a\u0345" + ch, "a\u0334" + ch + "\u0334", unicodedata.normalize("NFD", ch)]
        if any(nfc.normalize_str(p) != unicodedata.normalize("NFC", p) for p in probes):
            out.add(c)
            out.update(map(ord, unicodedata.normalize("NFD", ch)))
    return out


def random_strings(rng, avoid, n):
    """Adversarial mixtures: marks, jamo, apostrophes, odd whitespace, any plane-0/1 char."""
    gens = [
        lambda: chr(rng.randint(0x20, 0x7E)),
        lambda: rng.choice(" \t\n\r\u00a0\u3000\u0085\u2028\x0b\x0c"),
        lambda: chr(rng.randint(0x300, 0x36F)),
        lambda: chr(rng.randint(0x1100, 0x11FF)),
        lambda: chr(rng.randint(0xAC00, 0xD7A3)),
        lambda: rng.choice("'sStTrReEvVmMlLdD\u017f"),
        lambda: chr(rng.choice([rng.randint(0xA0, 0xD7FF), rng.randint(0xF900, 0xFFFD)])),
        lambda: chr(rng.randint(0x10000, 0x1FFFF)),
        lambda: rng.choice("0123456789"),
        lambda: rng.choice(["<|im_end|>", "<tool_call>", "<|fim_prefix|>"]),
    ]
    out = []
    while len(out) < n:
        s = "".join(rng.choice(gens)() for _ in range(rng.randint(1, 30)))
        if not any(ord(ch) in avoid or 0xD800 <= ord(ch) <= 0xDFFF for ch in s):
            out.append(s)
    return out


def make_strings(avoid):
    rng = random.Random(SEED)
    out = []
    pools = [CODE, JSON_TOOL, UNICODE, NFC_CHANGES, WHITESPACE, CONTRACTIONS, SPECIALS,
             NUMBERS, PUNCT, WORDS, CONTROL]
    # Every fragment alone, after a space, and between letters.
    for pool in pools:
        for s in pool:
            out += [s, " " + s, "a" + s + "b"]
    # Whitespace runs around each kind of character.
    for a in WHITESPACE:
        for b in ["x", "1", "!", "é", "中", "'s", "e\u0301", "<|im_end|>"]:
            out.append(a + b + a)
    # Each line of code with trailing spaces, tabs for indentation, CRLF endings.
    for snippet in CODE:
        out.append(snippet.replace("    ", "\t"))
        out.append(snippet.replace("\n", "\r\n"))
        out.append(snippet.replace("\n", "  \n"))
    # Random mixtures.
    frags = [f for pool in pools for f in pool]
    while len(out) < 1300:
        parts = []
        for _ in range(rng.randint(1, 12)):
            r = rng.random()
            if r < 0.3:
                parts.append(rng.choice(WORDS))
            elif r < 0.45:
                parts.append(rng.choice(WHITESPACE))
            elif r < 0.55:
                parts.append(rng.choice(NFC_CHANGES))
            else:
                parts.append(rng.choice(frags))
            if rng.random() < 0.5:
                parts.append(" ")
        out.append("".join(parts))
    # Longer documents: code files and chat transcripts.
    for _ in range(40):
        out.append("\n".join(rng.sample(CODE + JSON_TOOL, 4)))
        msgs = [f"<|im_start|>{rng.choice(['user', 'assistant', 'system'])}\n"
                f"{rng.choice(CODE + JSON_TOOL + UNICODE)}<|im_end|>\n" for _ in range(3)]
        out.append("".join(msgs))
    out += random_strings(rng, avoid, 500)
    seen, uniq = set(), []
    for s in out:
        if s not in seen:
            seen.add(s)
            uniq.append(s)
    return uniq


def main():
    import importlib.metadata
    import tokenizers
    path = model_path()
    if not os.path.exists(path):
        sys.exit(f"{path} is missing: run scripts/fetch-model.sh qwen2.5-coder-0.5b first")
    tok, num_tokens, num_merges, num_specials = reference_tokenizer(path)
    avoid = divergent_code_points()
    rows = []
    for s in make_strings(avoid):
        ids = tok.encode(s, add_special_tokens=False).ids
        decoded = tok.decode(ids, skip_special_tokens=False)
        # Added tokens are not normalized; NFC applies to the text between them.
        rows.append({"text": s, "ids": ids, "decoded": decoded})
    nfc_changed = sum(1 for r in rows if unicodedata.normalize("NFC", r["text"]) != r["text"])
    print(f"qwen tokenizer: {len(rows)} strings ({nfc_changed} changed by NFC), "
          f"{num_tokens} tokens, {num_merges} merges, {num_specials} added tokens",
          file=sys.stderr)
    write_jsonl("qwen_tokenizer_cases.jsonl", rows)
    write_jsonl("qwen_manifest.jsonl", [{
        "model_file": MODEL_FILE, "model_sha256": sha256(path),
        "fixture": "qwen_tokenizer_cases.jsonl",
        "generator": "scripts/make-qwen-tokenizer-fixture.py", "seed": SEED,
        "tokenizers": tokenizers.__version__, "gguf": importlib.metadata.version("gguf"),
        "python_unicodedata": unicodedata.unidata_version,
        "num_divergent_code_points_avoided": len(avoid),
        "num_cases": len(rows)}])


if __name__ == "__main__":
    main()
