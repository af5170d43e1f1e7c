#!/usr/bin/env python3
"""The llama.cpp anchor of `polykv-bench worker`: prefill and decode tokens/s.

Loads a GGUF with llama_cpp.Llama (llama-cpp-python, built from source by
scripts/setup-bench-venv.sh; a bench-only dependency), then, R rounds, each on
a cleared KV cache:
  prefill: one llama_decode of the P prompt token ids (llama.cpp splits it
           into n_batch/n_ubatch pieces itself), timed wall-clock;
  decode:  D greedy steps (argmax of the last logits, one token per
           llama_decode), timed wall-clock, argmax included, like the worker.
Prints one JSON object on stdout: the medians over rounds, every round, and
llama.cpp's own per-phase timers (llama_perf_context) as a cross-check.

The prompt is the exact token ids the worker saw (--prompt-ids FILE, written by
polykv-bench worker), so both engines process the same count; without it, a
fixed text tokenized by the model and repeated to P tokens.

Usage: llamacpp_bench.py --model GGUF [--threads N] [--prompt-tokens 256]
         [--decode-tokens 64] [--rounds 3] [--n-batch 512] [--prompt-ids FILE]
"""
import argparse
import ctypes
import json
import os
import statistics
import sys
import time

kText = ("The daemon owns the KV memory of every worker on the node. Agents call tools, "
         "read files and plan; their caches grow turn by turn. def f(x): return x * 2\n")


def die(msg):
    print(f"llamacpp_bench: error: {msg}", file=sys.stderr)
    sys.exit(1)


def vm_kib(field):
    """VmHWM / VmRSS of this process in bytes, or None off Linux."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def ggml_version(llama_cpp):
    """(version, commit) of the ggml that llama-cpp-python vendors and built."""
    lib_dir = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    try:
        lib = ctypes.CDLL(os.path.join(lib_dir, "libggml-base.so"))
        out = []
        for fn in ("ggml_version", "ggml_commit"):
            f = getattr(lib, fn)
            f.restype = ctypes.c_char_p
            out.append(f().decode())
        return out[0], out[1]
    except (OSError, AttributeError):
        return None, None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="GGUF file")
    ap.add_argument("--threads", type=int, default=os.cpu_count(),
                    help="n_threads and n_threads_batch (default: all cores)")
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n-batch", type=int, default=512, help="llama.cpp n_batch (and n_ubatch)")
    ap.add_argument("--prompt-ids", help="file of whitespace-separated token ids (first P used)")
    a = ap.parse_args()
    if min(a.threads, a.prompt_tokens, a.decode_tokens, a.rounds, a.n_batch) < 1:
        die("counts must be positive")
    if not os.path.isfile(a.model):
        die(f"no such model file: {a.model}")

    try:
        import llama_cpp
        import numpy as np
    except ImportError as e:
        die(f"{e}; run scripts/setup-bench-venv.sh and use its python "
            f"(~/.cache/polykv/bench-venv/bin/python)")

    n_ctx = a.prompt_tokens + a.decode_tokens + 16
    t0 = time.perf_counter()
    try:
        llm = llama_cpp.Llama(model_path=a.model, n_threads=a.threads, n_threads_batch=a.threads,
                              n_ctx=n_ctx, n_batch=a.n_batch, n_ubatch=a.n_batch,
                              verbose=False, use_mmap=True)
    except Exception as e:  # llama-cpp-python raises ValueError on a failed load
        die(f"llama.cpp cannot load {a.model}: {e}")
    load_s = time.perf_counter() - t0
    ctx = llm.ctx
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)

    if a.prompt_ids:
        with open(a.prompt_ids) as f:
            ids = [int(t) for t in f.read().split()]
        if len(ids) < a.prompt_tokens:
            die(f"{a.prompt_ids} has {len(ids)} ids, need --prompt-tokens {a.prompt_tokens}")
        ids = ids[:a.prompt_tokens]
        source = "ids from " + a.prompt_ids
    else:
        unit = llm.tokenize(kText.encode(), add_bos=False, special=False)
        ids = (unit * (a.prompt_tokens // len(unit) + 1))[:a.prompt_tokens]
        source = "fixed text, llama.cpp tokenizer"
    bad = [t for t in ids if not 0 <= t < n_vocab]
    if bad:
        die(f"token id {bad[0]} is outside this model's vocabulary of {n_vocab}")

    mem = llama_cpp.llama_get_memory(ctx)
    prompt = (llama_cpp.llama_token * len(ids))(*ids)
    tok = (llama_cpp.llama_token * 1)()
    prefill, decode, perf_prefill, perf_decode = [], [], [], []
    for r in range(a.rounds):
        llama_cpp.llama_memory_clear(mem, True)
        llama_cpp.llama_perf_context_reset(ctx)
        t0 = time.perf_counter()
        if llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(prompt, len(ids))) != 0:
            die("llama_decode failed on the prompt")
        llama_cpp.llama_synchronize(ctx)
        prefill.append(len(ids) / (time.perf_counter() - t0))
        t0 = time.perf_counter()
        for _ in range(a.decode_tokens):
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))
            tok[0] = int(logits.argmax())
            if llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(tok, 1)) != 0:
                die("llama_decode failed on a decode step")
        llama_cpp.llama_synchronize(ctx)
        decode.append(a.decode_tokens / (time.perf_counter() - t0))
        p = llama_cpp.llama_perf_context(ctx)
        if p.t_p_eval_ms > 0 and p.t_eval_ms > 0:
            perf_prefill.append(1000.0 * p.n_p_eval / p.t_p_eval_ms)
            perf_decode.append(1000.0 * p.n_eval / p.t_eval_ms)
        print(f"round {r} llama.cpp prefill {prefill[-1]:7.1f} tok/s  decode {decode[-1]:6.1f} tok/s",
              file=sys.stderr)

    gv, gc = ggml_version(llama_cpp)
    out = {
        "engine": "llama.cpp",
        "llama_cpp_python_version": llama_cpp.__version__,
        "ggml_version": gv,
        "ggml_commit": gc,
        "system_info": llama_cpp.llama_print_system_info().decode().strip(),
        "model": a.model,
        "threads": a.threads,
        "n_ctx": n_ctx,
        "n_batch": a.n_batch,
        "kv_type": "f16",  # llama.cpp's default type_k/type_v
        "prompt_source": source,
        "prompt_tokens": len(ids),
        "decode_tokens": a.decode_tokens,
        "rounds": a.rounds,
        "load_s": round(load_s, 3),
        "prefill_tokens_per_s": round(statistics.median(prefill), 2),
        "decode_tokens_per_s": round(statistics.median(decode), 2),
        "prefill_tokens_per_s_rounds": [round(x, 2) for x in prefill],
        "decode_tokens_per_s_rounds": [round(x, 2) for x in decode],
        # llama.cpp's own timers (no Python, no argmax): how much the loop adds.
        "perf_prefill_tokens_per_s": round(statistics.median(perf_prefill), 2) if perf_prefill else None,
        "perf_decode_tokens_per_s": round(statistics.median(perf_decode), 2) if perf_decode else None,
        "peak_rss_bytes": vm_kib("VmHWM"),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
