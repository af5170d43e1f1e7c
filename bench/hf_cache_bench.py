#!/usr/bin/env python3
"""polykv.hf against transformers' DynamicCache: decode step time and peak
memory, side by side in one run.

For each context length and each cache (DynamicCache with sdpa; polykv.hf
with f16 pages; polykv.hf with int8 keys and int4 values, "K8V4"), a fresh
process loads the model (transformers, f32 weights, from the worker's GGUF),
prefills the same CONTEXT token ids in chunks, then times DECODE single-token
steps (the forward pass with its cache; argmax included). Every polykv
session runs under QoS policy "full" (set through the Admin API), so pages
keep every token and the caches hold the same context.

Prints one JSON object: per configuration the median decode step (ms), the
prefill time, the cache's bytes and how far the process's RSS rose above
what it was once the model was loaded (sampled after every forward pass; the
pool's pages this process writes are shared memory it maps, so they count
in its RSS as DynamicCache's tensors do); and the ratios polykv /
DynamicCache at each context (step time, RSS rise), measured in this run.
(The process's peak RSS itself is the model loader's, the same for all.)

Usage: bench/hf_cache_bench.py [--model qwen|smollm2] [--contexts 1024,8192]
         [--decode 32] [--threads N] [--socket SOCK]
   (run with the venv of scripts/setup-python-venv.sh; without --socket a
    polykvd from build/bin is started for the run)
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = {"qwen": "Qwen2.5-Coder-0.5B-Instruct.gguf",
          "smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf"}
CACHES = {"dynamic": None, "polykv-f16": ("f16", "f16"), "polykv-k8v4": ("int8", "int4")}
PREFILL_CHUNK = 512


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def run_one(args) -> dict:
    """One configuration, in this process: the numbers of `measure`."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, DynamicCache

    import polykv
    import polykv.hf

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    if args.threads:
        torch.set_num_threads(args.threads)
    model_dir = Path(os.environ.get("POLYKV_MODEL_DIR", Path.home() / ".cache/polykv/models"))
    model = AutoModelForCausalLM.from_pretrained(model_dir, gguf_file=MODELS[args.model],
                                                 dtype=torch.float32).eval()
    formats = CACHES[args.one]
    if formats is None:
        cache = DynamicCache(config=model.config)
    else:
        agent = f"bench-{args.one}"
        with polykv.Admin(args.socket) as admin:
            admin.set_qos(polykv.Qos(agent_id=agent, policy="full"))
        model.set_attn_implementation(polykv.hf.ATTN_IMPLEMENTATION)
        cache = polykv.hf.PolykvCache(model.config, agent_id=agent, socket=args.socket,
                                      key_format=formats[0], value_format=formats[1],
                                      threads=args.threads)
    import gc
    gc.collect()
    base_rss = rss_bytes()
    peak_rss = base_rss
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(100, model.config.vocab_size - 100, (1, args.context), generator=gen)
    with torch.no_grad():
        t0 = time.perf_counter()
        for i in range(0, args.context, PREFILL_CHUNK):
            logits = model(ids[:, i:i + PREFILL_CHUNK], past_key_values=cache, use_cache=True,
                           logits_to_keep=1).logits
            peak_rss = max(peak_rss, rss_bytes())
        prefill_s = time.perf_counter() - t0
        token = logits[:, -1:].argmax(-1)
        steps = []
        for _ in range(args.decode):
            t = time.perf_counter()
            token = model(token, past_key_values=cache, use_cache=True).logits[:, -1:].argmax(-1)
            steps.append(time.perf_counter() - t)
            peak_rss = max(peak_rss, rss_bytes())
    if formats is None:
        cache_bytes = sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)
    else:
        cache_bytes = cache.bytes
    return {"cache": args.one, "context": args.context,
            "decode_ms_median": round(statistics.median(steps) * 1e3, 3),
            "decode_ms_min": round(min(steps) * 1e3, 3),
            "prefill_s": round(prefill_s, 3), "cache_bytes": cache_bytes,
            "rss_rise_bytes": peak_rss - base_rss}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=sorted(MODELS), default="qwen")
    p.add_argument("--contexts", default="1024,8192", help="context lengths, comma-separated")
    p.add_argument("--decode", type=int, default=32, help="decode steps timed per configuration")
    p.add_argument("--threads", type=int, default=0, help="torch and kernel threads (0: all)")
    p.add_argument("--socket", help="a running polykvd (default: start one)")
    p.add_argument("--one", choices=sorted(CACHES), help=argparse.SUPPRESS)
    p.add_argument("--context", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(run_one(args)))
        return 0
    daemon = None
    with tempfile.TemporaryDirectory(prefix="polykv-hf-bench-") as tmp:
        if not args.socket:
            sys.path.insert(0, str(ROOT / "bench" / "eval"))
            from live import Daemon  # polykvd on a private socket
            daemon = Daemon(str(ROOT / "build/bin/polykvd"), 8 << 30,
                            os.path.join(tmp, "polykvd.log"), ("--arena-bytes", "256MiB"))
            daemon.start()
            args.socket = daemon.socket
        rows = []
        try:
            for context in [int(c) for c in args.contexts.split(",")]:
                for name in CACHES:
                    print(f"hf_cache_bench: {name} at {context} tokens", file=sys.stderr)
                    out = subprocess.run(
                        [sys.executable, __file__, "--one", name, "--context", str(context),
                         "--model", args.model, "--decode", str(args.decode),
                         "--threads", str(args.threads), "--socket", args.socket],
                        check=True, capture_output=True, text=True).stdout
                    rows.append(json.loads(out.strip().splitlines()[-1]))
        finally:
            if daemon:
                daemon.stop()
    ratios = {}
    for context in sorted({r["context"] for r in rows}):
        by = {r["cache"]: r for r in rows if r["context"] == context}
        base = by["dynamic"]
        for name in ("polykv-f16", "polykv-k8v4"):
            ratios[f"{name}_vs_dynamic_decode@{context}"] = round(
                by[name]["decode_ms_median"] / base["decode_ms_median"], 3)
            ratios[f"{name}_vs_dynamic_rss_rise@{context}"] = round(
                by[name]["rss_rise_bytes"] / base["rss_rise_bytes"], 3)
    print(json.dumps({"bench": "hf_cache", "model": args.model, "threads": args.threads,
                      "decode_steps": args.decode, "ratios": ratios, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
