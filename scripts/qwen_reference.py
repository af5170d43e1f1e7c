#!/usr/bin/env python3
"""An independent numpy reference for the worker's Qwen2 (Qwen2.5-Coder) support.

What it is: a qwen2 forward pass written from the architecture, in numpy, on
float32 weights from gguf-py's own dequantization (`gguf.quants.dequantize`),
and the generator of the worker's Qwen fixtures. It shares no code with the C++
worker (client/worker/), which is tested against what it writes.

Never run by the tests (they only read tests/fixtures/worker/*.jsonl). Run it by
hand, from the repository root:

    scripts/fetch-model.sh qwen2.5-coder-0.5b; scripts/fetch-model.sh qwen2.5-coder-1.5b
    PY=~/.cache/polykv/ref-venv/bin/python   # gguf==0.19.0 numpy tokenizers jinja2
    $PY scripts/qwen_reference.py generate            # greedy sanity generation, both models
    $PY scripts/qwen_reference.py all                 # every fixture below

Subcommands:
  generate  greedy-decodes --steps tokens from the ChatML Fibonacci prompt (KV cache).
  logits    qwen_logits_cases.jsonl: per model, the prompts in PROMPTS with, for every
            position, argmax, margin (top1 - top2) and the top-8 logits; for the last
            position also the top-64 and 256 seeded probe ids.
  dequant   qwen_dequant_cases.jsonl: real tensors of each type in each file (rows 0, 1,
            last; float64 sum and sum of squares), and synthesized blocks of the types
            the files lack (hex bytes and their dequantization).
  manifest  qwen_fixture_manifest.jsonl (manifest.jsonl is make-worker-fixtures.py's).
  all       logits, dequant, manifest.

Precision: weights are gguf-py's float32 dequantization; activations, matmuls
(numpy/BLAS sgemm), RMSNorm, softmax and SiLU are float32, as in Hugging Face's
float32 Qwen2 forward. RoPE angles are computed in float64 (position * base^(-2i/d))
and cos/sin rounded to float32. --dtype float64 runs everything in float64 instead
(weights are still the float32 dequantized values, widened exactly).

Memory: all prompts are batched and the forward goes layer by layer, dequantizing
each layer's tensors once and dropping them; token embeddings are dequantized per
looked-up row only. `generate` keeps dequantized weights (up to ~6.2 GB for 1.5B)
so each step does not re-dequantize.

Tokenizer: Hugging Face `tokenizers` built from the GGUF's own vocabulary and merges:
NFC normalizer; Sequence[Split(qwen2 regex, Isolated), ByteLevel(add_prefix_space=
False, use_regex=False)]; ByteLevel decoder; token_type 3 (control) and 4 (user-
defined) entries as added special tokens.
"""
import argparse
import hashlib
import json
import math
import os
import sys
import time

import numpy as np
import gguf
import tokenizers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from qwen2_hf_tokenizer import qwen2_tokenizer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "worker")
MODEL_DIR = os.environ.get("POLYKV_MODEL_DIR", os.path.expanduser("~/.cache/polykv/models"))
SEED = 20261201

# name -> (file, sha256)
MODELS = {
    "qwen2.5-coder-0.5b": ("Qwen2.5-Coder-0.5B-Instruct.gguf",
                           "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
    "qwen2.5-coder-1.5b": ("Qwen2.5-Coder-1.5B-Instruct.gguf",
                           "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
}


SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
FIB_PROMPT = ("<|im_start|>system\n" + SYSTEM + "<|im_end|>\n<|im_start|>user\n"
              "Write a Python function that returns the n-th Fibonacci number.<|im_end|>\n"
              "<|im_start|>assistant\n")


def chatml(*turns):
    return "".join(f"<|im_start|>{r}\n{c}<|im_end|>\n" for r, c in turns) + "<|im_start|>assistant\n"


# (kind, text); each must tokenize to 8..80 tokens (checked).
PROMPTS = [
    ("raw", "The capital of France is Paris. The capital of Japan is"),
    ("raw", "Once upon a time, in a small village at the edge of a dark forest, there lived"),
    ("chat", FIB_PROMPT),
    ("chat", chatml(("system", SYSTEM), ("user", "What does HTTP status 404 mean?"))),
    ("chat", chatml(("user", "Hi!"), ("assistant", "Hello! How can I help you today?"),
                    ("user", "Tell me a joke about compilers."))),
    ("python", "def quicksort(xs):\n    if len(xs) <= 1:\n        return xs\n    pivot = xs[0]\n"
               "    left = [x for x in xs[1:] if x < pivot]\n"),
    ("python", "import numpy as np\n\nclass RMSNorm:\n    def __init__(self, dim, eps=1e-6):\n"
               "        self.eps = eps\n        self.weight = np.ones(dim)\n\n    def __call__(self, x):\n"),
    ("js", "async function fetchJson(url) {\n  const res = await fetch(url);\n  if (!res.ok) {\n"
           "    throw new Error(`HTTP ${res.status}`);\n  }\n"),
    ("js", "const users = [{name: 'Ada', age: 36}, {name: 'Linus', age: 54}];\n"
           "const names = users.filter(u => u.age > 40).map("),
    ("json", '{"results": [{"id": 17, "title": "Fix race in KvPool::Reserve", "state": "open"}, '
             '{"id": 18, "title": "Add Q4_K dequant", "state": "'),
    ("tool_output", chatml(("user", "What's the weather in Paris?"),
                           ("assistant", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'),
                           ("user", '<tool_response>\n{"temperature_c": 14.5, "condition": "light rain", '
                                    '"humidity": 0.82}\n</tool_response>'))),
    ("tool_call", "<|im_start|>user\nList the files in /tmp please.<|im_end|>\n<|im_start|>assistant\n"
                  '<tool_call>\n{"name": "list_dir", "arguments": {"path": "'),
    ("cjk", "北京是中华人民共和国的首都，也是全国的政治、文化中心。它的历史"),
    ("cjk", chatml(("user", "用Python写一个函数，计算列表中所有偶数的和。"))),
    ("numbers", "1, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144,"),
    ("numbers", "3.14159 * 2 = 6.28318; 2**10 = 1024; 1e6 + 42 = 1000042; 0x1F ="),
    ("mixed", "# TODO(日本語): handle émoji 🚀 and tabs\tin README.md — see issue #12345\n"),
    ("fim", "<|fim_prefix|>def add(a, b):\n    <|fim_suffix|>\n    return result<|fim_middle|>"),
]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def model_path(name):
    return os.path.join(MODEL_DIR, MODELS[name][0])


class Weights:
    """The GGUF's tensors, dequantized by gguf-py on demand (float32, [ne1, ne0])."""

    def __init__(self, path, keep=False):
        self.reader = gguf.GGUFReader(path)
        self.tensors = {t.name: t for t in self.reader.tensors}
        self.keep = keep
        self._cache = {}

    def field(self, key):
        return self.reader.fields[key].contents()

    def get(self, name):
        if name in self._cache:
            return self._cache[name]
        t = self.tensors[name]
        w = np.ascontiguousarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        if self.keep:
            self._cache[name] = w
        return w

    def rows(self, name, ids):
        """Rows `ids` of a 2-D tensor, dequantizing only those rows."""
        t = self.tensors[name]
        return np.ascontiguousarray(gguf.quants.dequantize(t.data[np.asarray(ids)], t.tensor_type),
                                    dtype=np.float32)


class Hparams:
    def __init__(self, w):
        arch = w.field("general.architecture")
        assert arch == "qwen2", arch
        p = arch + "."
        self.n_layer = int(w.field(p + "block_count"))
        self.n_embd = int(w.field(p + "embedding_length"))
        self.n_ff = int(w.field(p + "feed_forward_length"))
        self.n_head = int(w.field(p + "attention.head_count"))
        self.n_head_kv = int(w.field(p + "attention.head_count_kv"))
        self.eps = float(w.field(p + "attention.layer_norm_rms_epsilon"))
        self.rope_base = float(w.field(p + "rope.freq_base"))
        self.head_dim = self.n_embd // self.n_head
        self.n_vocab = int(w.tensors["output.weight"].shape[1])

    def __repr__(self):
        return repr(self.__dict__)


class Seq:
    """One sequence's KV cache: per layer K, V [n_head_kv, n_past, head_dim] (K after RoPE)."""

    def __init__(self, n_layer):
        self.k = [None] * n_layer
        self.v = [None] * n_layer
        self.n_past = 0


def rms_norm(x, w, eps):
    # x [T, n_embd]; mean of squares in the compute dtype, as HF does in float32.
    var = np.mean(x * x, axis=-1, keepdims=True)
    return (x / np.sqrt(var + x.dtype.type(eps))) * w


def rope_cos_sin(pos, head_dim, base, dtype):
    # NEOX / rotate-half: dims i and i + d/2 pair with frequency base^(-2i/d).
    inv = base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)  # [d/2]
    ang = np.asarray(pos, dtype=np.float64)[:, None] * inv[None, :]  # [T, d/2]
    return np.cos(ang).astype(dtype), np.sin(ang).astype(dtype)


def apply_rope(x, cos, sin):
    # x [T, n_heads, d]; cos, sin [T, d/2]
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    c, s = cos[:, None, :], sin[:, None, :]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def silu(x):
    return x / (x.dtype.type(1) + np.exp(-x))


def forward(w, hp, batch, dtype=np.float32):
    """Runs new tokens of several sequences together, layer by layer.

    batch: list of (Seq, ids). Appends to each Seq's cache. Returns the
    output-normed hidden states [T_total, n_embd] (concatenated in batch order)
    and the per-sequence slices into them.
    """
    ids = np.concatenate([np.asarray(t, dtype=np.int64) for _, t in batch])
    slices, pos, o = [], [], 0
    for s, t in batch:
        slices.append(slice(o, o + len(t)))
        pos.append(np.arange(s.n_past, s.n_past + len(t)))
        o += len(t)
    pos = np.concatenate(pos)
    x = w.rows("token_embd.weight", ids).astype(dtype)  # [T, n_embd]
    cos, sin = rope_cos_sin(pos, hp.head_dim, hp.rope_base, dtype)
    nh, nkv, d = hp.n_head, hp.n_head_kv, hp.head_dim
    group = nh // nkv
    scale = dtype(1.0 / math.sqrt(d))
    T = len(ids)
    for L in range(hp.n_layer):
        g = lambda n: w.get(f"blk.{L}.{n}").astype(dtype, copy=False)
        h = rms_norm(x, g("attn_norm.weight"), hp.eps)
        q = (h @ g("attn_q.weight").T + g("attn_q.bias")).reshape(T, nh, d)
        k = (h @ g("attn_k.weight").T + g("attn_k.bias")).reshape(T, nkv, d)
        v = (h @ g("attn_v.weight").T + g("attn_v.bias")).reshape(T, nkv, d)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        att = np.empty((T, nh * d), dtype=dtype)
        for (s, _), sl in zip(batch, slices):
            kn, vn = k[sl].transpose(1, 0, 2), v[sl].transpose(1, 0, 2)  # [nkv, t, d]
            if s.k[L] is not None:
                kn = np.concatenate([s.k[L], kn], axis=1)
                vn = np.concatenate([s.v[L], vn], axis=1)
            s.k[L], s.v[L] = kn, vn
            t = sl.stop - sl.start
            S = kn.shape[1]
            qs = q[sl].transpose(1, 0, 2).reshape(nkv, group, t, d)  # head h uses kv h // group
            sc = np.einsum("kgtd,ksd->kgts", qs, kn) * scale  # [nkv, group, t, S]
            qpos = np.arange(S - t, S)[:, None]
            mask = np.arange(S)[None, :] > qpos  # causal
            sc = np.where(mask, -np.inf, sc).astype(dtype)
            sc = sc - sc.max(axis=-1, keepdims=True)
            p = np.exp(sc)
            p = p / p.sum(axis=-1, keepdims=True)
            o_ = np.einsum("kgts,ksd->kgtd", p, vn).reshape(nh, t, d)
            att[sl] = o_.transpose(1, 0, 2).reshape(t, nh * d)
        x = x + att @ g("attn_output.weight").T
        h = rms_norm(x, g("ffn_norm.weight"), hp.eps)
        gate = h @ g("ffn_gate.weight").T
        up = h @ g("ffn_up.weight").T
        x = x + (silu(gate) * up) @ g("ffn_down.weight").T
    for s, t in batch:
        s.n_past += len(t)
    x = rms_norm(x, w.get("output_norm.weight").astype(dtype, copy=False), hp.eps)
    return x, slices


def build_tokenizer(w):
    return qwen2_tokenizer(w.field("tokenizer.ggml.tokens"), w.field("tokenizer.ggml.token_type"),
                           w.field("tokenizer.ggml.merges"))


def load(name, keep=False):
    w = Weights(model_path(name), keep=keep)
    return w, Hparams(w), build_tokenizer(w)


def cmd_generate(args):
    for name in args.models:
        t0 = time.time()
        w, hp, tk = load(name, keep=True)
        ids = tk.encode(FIB_PROMPT).ids
        eos = int(w.field("tokenizer.ggml.eos_token_id"))
        W_out = w.get("output.weight").astype(args.dtype, copy=False)
        s = Seq(hp.n_layer)
        new, margins, step = [], [], ids
        for _ in range(args.steps):
            x, _ = forward(w, hp, [(s, step)], args.dtype)
            logits = x[-1] @ W_out.T
            top2 = np.argsort(logits)[-2:]
            nxt = int(top2[-1])
            margins.append(float(logits[top2[-1]] - logits[top2[0]]))
            new.append(nxt)
            if nxt == eos:
                break
            step = [nxt]
        text = tk.decode(new, skip_special_tokens=False)
        print(json.dumps({"model": name, "dtype": np.dtype(args.dtype).name, "prompt_tokens": len(ids),
                          "ids": new, "min_margin": round(min(margins), 4),
                          "seconds": round(time.time() - t0, 1), "text": text}, ensure_ascii=False))
        del w, W_out, s


def r5(a):
    return [round(float(v), 5) for v in a]


def logits_cases(name, dtype, probe_seed):
    w, hp, tk = load(name)
    digest = MODELS[name][1]
    enc = []
    for kind, text in PROMPTS:
        ids = tk.encode(text).ids
        assert 8 <= len(ids) <= 80, (kind, text, len(ids))
        assert tk.decode(ids, skip_special_tokens=False) == text, text
        enc.append((kind, text, ids))
    seqs = [Seq(hp.n_layer) for _ in enc]
    x, slices = forward(w, hp, [(s, e[2]) for s, e in zip(seqs, enc)], dtype)
    del seqs
    W_out = w.get("output.weight").astype(dtype, copy=False)  # [n_vocab, n_embd]
    probes = np.sort(np.random.default_rng(probe_seed).choice(hp.n_vocab, 256, replace=False))
    rows = []
    for (kind, text, ids), sl in zip(enc, slices):
        lg = x[sl] @ W_out.T  # [t, n_vocab]
        top = np.argsort(-lg, axis=-1, kind="stable")[:, :64]
        tl = np.take_along_axis(lg, top, axis=-1)
        rows.append({
            "model": name, "model_sha256": digest, "kind": kind, "text": text, "ids": ids,
            "argmax": top[:, 0].tolist(),
            "margin": r5(tl[:, 0].astype(np.float64) - tl[:, 1].astype(np.float64)),
            "top_ids": top[:, :8].tolist(), "top_logits": [r5(r) for r in tl[:, :8]],
            "last_top_ids": top[-1].tolist(), "last_top_logits": r5(tl[-1]),
            "probe_ids": probes.tolist(), "probe_logits": r5(lg[-1, probes]),
        })
    return rows


def write_jsonl(fname, rows):
    path = os.path.join(OUT, fname)
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n")
    print(f"wrote {path} ({len(rows)} rows, {os.path.getsize(path)} bytes)", file=sys.stderr)


def cmd_logits(args):
    rows = []
    for i, name in enumerate(args.models):
        t0 = time.time()
        rows += logits_cases(name, args.dtype, SEED + i)
        print(f"{name}: logits in {time.time() - t0:.1f} s", file=sys.stderr)
    write_jsonl("qwen_logits_cases.jsonl", rows)


class F32List(list):
    """float32 values written as their shortest round-trip decimal (strtod then (float) recovers them)."""


def f32_tokens(a):
    a = np.asarray(a, dtype=np.float32).ravel()
    out = []
    for v in a:
        s = str(v)  # numpy: shortest string that round-trips the float32
        if not np.isfinite(v):
            raise ValueError(f"non-finite value {s}")
        if np.float32(float(s)) != v:  # double-rounding guard for strtod + cast readers
            s = repr(float(v))
        out.append(s)
    return out


def dumps_with_f32(obj):
    """json.dumps, with F32List values written via f32_tokens."""
    marks = {}

    def enc(o):
        if isinstance(o, F32List):
            k = f"@@F32_{len(marks)}@@"
            marks[k] = "[" + ",".join(f32_tokens(o)) + "]"
            return k
        if isinstance(o, dict):
            return {kk: enc(vv) for kk, vv in o.items()}
        if isinstance(o, list):
            return [enc(vv) for vv in o]
        return o

    s = json.dumps(enc(obj), ensure_ascii=False, separators=(",", ":"))
    for k, v in marks.items():
        s = s.replace(f'"{k}"', v)
    return s


# gguf-py 0.19.0's dequantization, per block (float32; d, dmin f16 -> f32 exactly; q unsigned
# unless noted; "lo/hi" = low/high nibble). Every product below is exact in float32 (at most
# 24 significant bits), so the only rounding is the final add/sub of the *_1 and *_K types:
# evaluation order and FMA do not change a bit (checked against a float64 ggml-style version).
#   Q4_0 [d|qs16]       y[i] = d*(lo(qs[i])-8), y[i+16] = d*(hi(qs[i])-8)
#   Q4_1 [d|m|qs16]     y[i] = d*lo(qs[i]) + m, y[i+16] = d*hi(qs[i]) + m
#   Q5_0 [d|qh u32le|qs16]  q[j] = nibble as Q4_0 | ((qh>>j)&1)<<4;  y[j] = d*(q[j]-16)
#   Q5_1 [d|m|qh|qs16]  y[j] = d*q[j] + m
#   Q8_0 [d|qs int8 32] y[j] = qs[j]*d
#   Q4_K [d|dmin|scales12|qs128] sub-block s (0..7, 32 values): sc,mn = 6-bit pairs:
#        s<4: sc=b[s]&63, mn=b[s+4]&63;  s>=4: sc=(b[s+4]&15)|(b[s-4]>>6)<<4, mn=(b[s+4]>>4)|(b[s]>>6)<<4
#        q = s even: lo(qs[32*(s/2)+l]), odd: hi(...);  y = (d*sc)*q - (dmin*mn)
#   Q5_K [d|dmin|scales12|qh32|qs128] as Q4_K, q |= ((qh[l]>>s)&1)<<4
#   Q6_K [ql128|qh64|scales int8 16|d] (at the END): for n in 0,1; l in 0..31; base 128n:
#        y[l]   = d*sc[8n+l/16]  *((lo(ql[64n+l])    | (qh[32n+l]>>0&3)<<4)-32)
#        y[l+32]= d*sc[8n+l/16+2]*((lo(ql[64n+l+32]) | (qh[32n+l]>>2&3)<<4)-32)
#        y[l+64]= d*sc[8n+l/16+4]*((hi(ql[64n+l])    | (qh[32n+l]>>4&3)<<4)-32)
#        y[l+96]= d*sc[8n+l/16+6]*((hi(ql[64n+l+32]) | (qh[32n+l]>>6&3)<<4)-32)
#   Q8_K [d f32|qs int8 256|bsums i16 16] y = d*qs (one rounding); gguf-py lacks it (ggml's).

# Real tensors to record per model: every non-F32 type present gets up to 3 of these
# candidates (first ones of that type), plus one small F32 tensor.
DEQUANT_CANDIDATES = [
    "blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight", "blk.0.ffn_down.weight",
    "blk.11.ffn_down.weight", "blk.0.attn_output.weight", "token_embd.weight", "output.weight",
    "blk.0.ffn_gate.weight",
]


def real_dequant_cases(name):
    w = Weights(model_path(name))
    digest = MODELS[name][1]
    by_type = {}
    for n in DEQUANT_CANDIDATES:
        t = w.tensors.get(n)
        if t is not None and t.tensor_type != gguf.GGMLQuantizationType.F32:
            by_type.setdefault(t.tensor_type.name, []).append(n)
    picks = [n for ns in by_type.values() for n in ns[:3]] + ["blk.0.attn_q.bias"]
    rows = []
    for n in picks:
        t = w.tensors[n]
        x = w.get(n)
        if x.ndim == 1:
            x = x.reshape(1, -1)
        s1 = s2 = 0.0  # float64, numpy pairwise within 4096-row chunks, chunks added in order
        for r0 in range(0, x.shape[0], 4096):
            c = x[r0:r0 + 4096].astype(np.float64)
            s1 += float(np.sum(c))
            s2 += float(np.sum(c * c))
        last = x.shape[0] - 1
        rows.append({
            "case": "real", "model": name, "model_sha256": digest, "tensor": n,
            "type": t.tensor_type.name, "dims": [int(d) for d in t.shape],  # GGUF order: ne0, ne1
            "row_len": int(x.shape[1]), "num_rows": int(x.shape[0]),
            "rows": {str(r): F32List(x[r]) for r in sorted({0, min(1, last), last})},  # 1-D: row 0 only
            "sum": s1, "sum_sq": s2,
        })
        del x
    return rows


def random_f16(rng, n, lo, hi, signed=True):
    mag = np.exp(rng.uniform(np.log(lo), np.log(hi), n))
    if signed:
        mag *= rng.choice([-1.0, 1.0], n)
    return mag.astype(np.float16)


def synth_blocks(qtype, rng, n_elems=512):
    """Seeded random blocks of qtype covering n_elems values, with sane scales."""
    T = gguf.GGMLQuantizationType
    bs, ts = gguf.GGML_QUANT_SIZES[qtype]
    nb = n_elems // bs
    raw = rng.integers(0, 256, size=(nb, ts), dtype=np.uint8)
    f16 = lambda lo, hi, signed=True: random_f16(rng, nb, lo, hi, signed).view(np.uint8).reshape(nb, 2)
    if qtype in (T.Q4_0, T.Q5_0, T.Q8_0):
        raw[:, 0:2] = f16(1e-3, 5e-2)
    elif qtype in (T.Q4_1, T.Q5_1):
        raw[:, 0:2] = f16(1e-3, 5e-2, signed=False)
        raw[:, 2:4] = f16(1e-2, 1.0)
    elif qtype in (T.Q4_K, T.Q5_K):
        raw[:, 0:2] = f16(1e-4, 5e-3, signed=False)
        raw[:, 2:4] = f16(1e-4, 5e-3, signed=False)
    elif qtype == T.Q6_K:
        raw[:, ts - 2:ts] = f16(1e-4, 5e-3)
    elif qtype == T.Q8_K:
        d = (np.exp(rng.uniform(np.log(1e-4), np.log(1e-2), nb)) * rng.choice([-1.0, 1.0], nb))
        raw[:, 0:4] = d.astype(np.float32).view(np.uint8).reshape(nb, 4)
        qs = raw[:, 4:4 + 256].view(np.int8).astype(np.int16)
        bsums = qs.reshape(nb, 16, 16).sum(axis=-1).astype("<i2")  # consistent, unused by dequant
        raw[:, 4 + 256:] = bsums.view(np.uint8).reshape(nb, 32)
    return raw


def dequant_q8_k(raw):
    # gguf-py 0.19.0 has no Q8_K dequantizer; ggml's dequantize_row_q8_K: y = d * (float)q,
    # d float32 at byte 0, q int8 at bytes 4..259, bsums int16 [16] at 260..291 (unused).
    d = raw[:, 0:4].copy().view(np.float32)  # [nb, 1]
    q = raw[:, 4:260].copy().view(np.int8).astype(np.float32)
    return (d * q).reshape(-1)


def synth_dequant_cases(seed):
    T = gguf.GGMLQuantizationType
    rows = []
    for i, qtype in enumerate([T.Q5_K, T.Q8_K, T.Q4_0, T.Q4_1, T.Q5_1, T.Q5_0, T.Q8_0, T.Q4_K, T.Q6_K]):
        rng = np.random.default_rng(seed + 1000 + i)
        raw = synth_blocks(qtype, rng)
        bs, ts = gguf.GGML_QUANT_SIZES[qtype]
        if qtype == T.Q8_K:
            vals, by = dequant_q8_k(raw), "ggml dequantize_row_q8_K formula (gguf-py has none)"
        else:
            vals, by = gguf.quants.dequantize(raw.reshape(1, -1), qtype).reshape(-1), "gguf.quants.dequantize"
        assert np.all(np.isfinite(vals)), qtype
        rows.append({
            "case": "synthetic", "type": qtype.name, "seed": seed + 1000 + i, "block_size": bs,
            "type_size": ts, "num_blocks": int(raw.shape[0]), "num_values": int(vals.size),
            "dequantizer": by, "hex": raw.tobytes().hex(), "values": F32List(vals),
        })
    return rows


def cmd_dequant(args):
    rows = []
    for name in args.models:
        t0 = time.time()
        rows += real_dequant_cases(name)
        print(f"{name}: dequant cases in {time.time() - t0:.1f} s", file=sys.stderr)
    rows += synth_dequant_cases(SEED)
    path = os.path.join(OUT, "qwen_dequant_cases.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(dumps_with_f32(r) + "\n")
    print(f"wrote {path} ({len(rows)} rows, {os.path.getsize(path)} bytes)", file=sys.stderr)


def cmd_manifest(args):
    row = {
        "generator": "scripts/qwen_reference.py", "seed": SEED,
        "precision": np.dtype(args.dtype).name + " activations and matmuls on gguf-py float32 weights",
        "gguf": getattr(gguf, "__version__", None) or _dist_version("gguf"),
        "numpy": np.__version__, "tokenizers": tokenizers.__version__,
        "python": sys.version.split()[0],
        "models": {n: {"file": f, "sha256": h} for n, (f, h) in MODELS.items()},
        "files": ["qwen_logits_cases.jsonl", "qwen_dequant_cases.jsonl"],
    }
    write_jsonl("qwen_fixture_manifest.jsonl", [row])


def _dist_version(dist):
    from importlib.metadata import version
    return version(dist)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cmd", choices=["generate", "logits", "dequant", "manifest", "all", "verify-sha"])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--steps", type=int, default=24)
    args = ap.parse_args()
    args.dtype = np.float32 if args.dtype == "float32" else np.float64
    if args.cmd in ("verify-sha", "all", "logits", "dequant"):
        for n in args.models:
            got = sha256(model_path(n))
            if got != MODELS[n][1]:
                sys.exit(f"{model_path(n)}: sha256 {got}, expected {MODELS[n][1]}; "
                         f"run scripts/fetch-model.sh {n}")
    t0 = time.time()
    if args.cmd == "generate":
        cmd_generate(args)
    if args.cmd in ("logits", "all"):
        cmd_logits(args)
    if args.cmd in ("dequant", "all"):
        cmd_dequant(args)
    if args.cmd in ("manifest", "all"):
        cmd_manifest(args)
    print(f"{args.cmd}: {time.time() - t0:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
