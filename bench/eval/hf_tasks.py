#!/usr/bin/env python3
"""transformers with its cache in polykvd (polykv.hf) against DynamicCache on
bench/eval tasks, beside the reference worker on the same tasks.

For each task (a worker script from workloads/gen.py: messages, then one
generated answer with an answer prefix):

  transformers (the same GGUF, f32 weights):
    dynamic   DynamicCache, sdpa: the reference answer, and the reference's
              log-probabilities over its own answer (teacher-forced: the
              answer run as one chunk after the prompt);
    polykv    PolykvCache under the daemon's shipped default QoS (nothing set
              for the agent), prefilled message by message (begin_turn, then
              polykv.hf.prefill: 64-token chunks with the policy's KVzip
              probes, as the worker does); its free answer, then, on a second
              session prefilled the same way, the reference answer
              teacher-forced: KL(reference || polykv) per answer token.
  the worker (polykv-worker, its own forward pass):
    local     --local-cache (dense f32): its reference answer and log-probs;
    pool      --daemon under the same default QoS: its free answer, and
              teacher-forced on its reference (kl_mean, top1_agreement).

KL is reported two ways for transformers: over the full vocabulary, and as
the worker computes it (the reference's top 64 plus one bin for the rest: a
lower bound), so the two paths compare like for like. Answers are scored by
bench/eval/score.py. One JSON line per task in --out (--resume skips tasks
already there), then a summary on stdout.

Usage: bench/eval/hf_tasks.py TASK.jsonl... --out OUT.jsonl [--model qwen]
          [--resume] [--no-worker]
   (the venv of scripts/setup-python-venv.sh; starts its own polykvd)
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "eval"))
from live import Daemon  # noqa: E402
from score import score  # noqa: E402

MODELS = {"qwen": ("Qwen2.5-Coder-0.5B-Instruct.gguf", "qwen2.5-coder-0.5b"),
          "smollm2": ("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m")}
TOP_K = 64  # the worker's --logprobs-top default
CHUNK = 64  # the worker's --prefill-chunk default


def read_task(path: Path) -> tuple[list[dict], dict]:
    lines = [json.loads(l) for l in path.read_text().splitlines() if l.strip()]
    return lines[:-1], lines[-1]


def render(tok, messages: list[dict], gen: dict):
    """The prompt's token ids and, per message, (first token, role)."""
    conv = [{k: m[k] for k in ("role", "content", "tool_calls") if k in m} for m in messages]
    text = tok.apply_chat_template(conv, add_generation_prompt=True, tokenize=False)
    text += gen.get("answer_prefix", "")
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    starts = []
    for i in range(len(conv)):
        prefix = tok.apply_chat_template(conv[:i], tokenize=False) if i else ""
        if not text.startswith(prefix):
            return torch.tensor([enc.input_ids]), [(0, "user")]  # not prefix-stable: one turn
        starts.append(len(prefix))
    bounds = []
    for char, m in zip(starts, conv):
        first = next(t for t, (a, _) in enumerate(enc.offset_mapping) if a >= char)
        bounds.append((first, {"tool": "tool_output"}.get(m["role"], m["role"])))
    return torch.tensor([enc.input_ids]), bounds


def kl_stats(ref_logits: torch.Tensor, logits: torch.Tensor) -> dict:
    """KL(ref || this) per position, full vocabulary and the worker's top-k+rest."""
    p_log = torch.log_softmax(ref_logits.double(), -1)
    q_log = torch.log_softmax(logits.double(), -1)
    full = (p_log.exp() * (p_log - q_log)).sum(-1)
    top = p_log.topk(TOP_K, -1).indices
    pt, qt = p_log.gather(-1, top), q_log.gather(-1, top)
    p_rest = (1 - pt.exp().sum(-1)).clamp_min(1e-300)
    q_rest = (1 - qt.exp().sum(-1)).clamp_min(1e-300)
    binned = (pt.exp() * (pt - qt)).sum(-1) + p_rest * (p_rest.log() - q_rest.log())
    agree = (ref_logits.argmax(-1) == logits.argmax(-1)).double()
    return {"kl_mean": full.mean().item(), "kl_max": full.max().item(),
            "kl_top64_mean": binned.mean().item(), "top1_agreement": agree.mean().item()}


@torch.no_grad()
def run_dynamic(model, ids: torch.Tensor, max_new: int):
    from transformers import DynamicCache
    cache = DynamicCache(config=model.config)
    for i in range(0, ids.shape[1] - 1, 512):
        model(ids[:, i:min(i + 512, ids.shape[1] - 1)], past_key_values=cache)
    out = model.generate(ids, past_key_values=cache, max_new_tokens=max_new, do_sample=False)
    answer = out[0, ids.shape[1]:]
    cache.crop(ids.shape[1] - 1)
    forced = torch.cat([ids[:, -1:], answer[None, :-1]], dim=1)
    logits = model(forced, past_key_values=cache).logits[0]
    return answer, logits


@torch.no_grad()
def prefill_polykv(model, tok, ids, bounds, socket: str, agent: str):
    import polykv.hf
    cache = polykv.hf.PolykvCache(model.config, agent_id=agent, socket=socket)
    ends = [b for b, _ in bounds[1:]] + [ids.shape[1] - 1]
    for (first, role), end in zip(bounds, ends):
        cache.begin_turn(role)
        if end > first:
            polykv.hf.prefill(model, cache, ids[:, first:end], chunk=CHUNK, tokenizer=tok)
    return cache


@torch.no_grad()
def run_polykv(model, tok, ids, bounds, max_new, answer, socket, agent):
    cache = prefill_polykv(model, tok, ids, bounds, socket, agent)
    cache.begin_turn("assistant")
    out = model.generate(ids, past_key_values=cache, max_new_tokens=max_new, do_sample=False)
    free = out[0, ids.shape[1]:]
    stats = {"epoch": cache.epoch, "slots": cache.num_slots, "seen": cache.seen_tokens,
             "kv_bytes": cache.bytes, "kv_bytes_peak": cache.peak_bytes}
    cache.close()
    cache = prefill_polykv(model, tok, ids, bounds, socket, agent + "-forced")
    cache.begin_turn("assistant")
    forced = torch.cat([ids[:, -1:], answer[None, :-1]], dim=1)
    logits = model(forced, past_key_values=cache).logits[0]
    cache.close()
    return free, logits, stats


def run_worker(task: Path, model: str, socket: str, agent: str, tmp: str) -> dict:
    """polykv-worker on the task: local reference, then the pool free and forced."""
    worker = [str(ROOT / "build/bin/polykv-worker"), "run", str(task), "--model", model]
    ref_lp = os.path.join(tmp, f"{task.stem}.ref.jsonl")

    def last(cmd):
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        return json.loads(out.strip().splitlines()[-1])

    ref = last(worker + ["--local-cache", "--logprobs-out", ref_lp])
    pool = last(worker + ["--daemon", socket, "--agent", agent])
    forced = last(worker + ["--daemon", socket, "--agent", agent + "-forced",
                            "--teacher-force", ref_lp])
    return {"ref_text": ref["text"], "pool_text": pool["text"], "pool_epoch": pool["epoch"],
            "pool_kv_bytes_peak": pool["kv_bytes_peak"], "kl_mean": forced["kl_mean"],
            "kl_max": forced["kl_max"], "top1_agreement": forced["top1_agreement"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("tasks", nargs="+", type=Path)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--model", choices=sorted(MODELS), default="qwen")
    p.add_argument("--resume", action="store_true", help="skip tasks already in --out")
    p.add_argument("--no-worker", action="store_true", help="transformers only")
    args = p.parse_args()

    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer
    import polykv.hf  # registers attn_implementation="polykv"
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()

    done = set()
    if args.resume and args.out.exists():
        done = {json.loads(l)["id"] for l in args.out.read_text().splitlines() if l.strip()}
    elif args.out.exists():
        args.out.unlink()
    file, name = MODELS[args.model]
    model_dir = Path(os.environ.get("POLYKV_MODEL_DIR", Path.home() / ".cache/polykv/models"))
    tok = AutoTokenizer.from_pretrained(model_dir, gguf_file=file)
    model = AutoModelForCausalLM.from_pretrained(model_dir, gguf_file=file,
                                                 dtype=torch.float32).eval()
    with tempfile.TemporaryDirectory(prefix="polykv-hf-tasks-") as tmp:
        # polykvd's built-in pool (1 GiB), so its default QoS is what runs.
        daemon = Daemon(str(ROOT / "build/bin/polykvd"), 1 << 30, os.path.join(tmp, "polykvd.log"))
        daemon.start()
        sock = daemon.socket
        try:
            for task in args.tasks:
                messages, gen = read_task(task)
                if gen["id"] in done:
                    continue
                t0 = time.monotonic()
                ids, bounds = render(tok, messages, gen)
                max_new = gen.get("max_new_tokens", 64)
                model.set_attn_implementation("sdpa")
                ref, ref_logits = run_dynamic(model, ids, max_new)
                model.set_attn_implementation("polykv")
                free, logits, stats = run_polykv(model, tok, ids, bounds, max_new, ref, sock,
                                                 f"hf-{gen['id']}")
                prefix = gen.get("answer_prefix", "")
                ref_text = tok.decode(ref, skip_special_tokens=True)
                free_text = tok.decode(free, skip_special_tokens=True)
                row = {"id": gen["id"], "family": gen["eval"]["family"],
                       "prompt_tokens": ids.shape[1], "hf": {
                           "ref_text": ref_text, "polykv_text": free_text,
                           "identical": ref.tolist() == free.tolist(),
                           "ref_success": score(gen["eval"], prefix + ref_text)["success"],
                           "polykv_success": score(gen["eval"], prefix + free_text)["success"],
                           **stats, **kl_stats(ref_logits, logits)}}
                if not args.no_worker:
                    w = run_worker(task, name, sock, f"w-{gen['id']}", tmp)
                    w["identical"] = w["ref_text"] == w["pool_text"]
                    w["ref_success"] = score(gen["eval"], prefix + w["ref_text"])["success"]
                    w["pool_success"] = score(gen["eval"], prefix + w["pool_text"])["success"]
                    row["worker"] = w
                row["seconds"] = round(time.monotonic() - t0, 1)
                with args.out.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                print(f"hf_tasks: {gen['id']}: {row['seconds']} s", file=sys.stderr)
        finally:
            daemon.stop()
    rows = [json.loads(l) for l in args.out.read_text().splitlines() if l.strip()]
    summary = {"tasks": len(rows)}
    for side, keys in (("hf", ("identical", "ref_success", "polykv_success", "kl_mean",
                                "kl_top64_mean", "top1_agreement")),
                       ("worker", ("identical", "ref_success", "pool_success", "kl_mean",
                                   "top1_agreement"))):
        have = [r[side] for r in rows if side in r]
        if have:
            summary[side] = {k: round(sum(float(h[k]) for h in have) / len(have), 4)
                             for k in keys}
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
