#!/usr/bin/env python3
"""The kvpress anchor of the agentic evaluation: NVIDIA kvpress's presses on
the same model, tasks and measures as `eval.py`, so the report can put them
beside polykv's configs (issue [fidelity] item 5).

What runs: Hugging Face transformers (CPU torch, float32) on the GGUF's own
weights (transformers dequantizes them, as scripts/qwen_reference.py does),
and kvpress's presses, pinned in bench/anchor/kvpress-requirements.txt
(scripts/setup-kvpress-venv.sh makes the venv). A bench-only dependency:
nothing in polykv imports torch.

Per task (a bench/eval/workloads JSONL script; the last assistant line without
"content" is the turn under test, the user line before it the question):
  1. The prompt is rendered with the GGUF's chat template and tokenized with the
     GGUF's vocabulary (scripts/gguf_chat.py), exactly as polykv-worker sends
     it: the context is every message before the question, the question is the
     question message plus the generation prompt plus the tokens of
     "answer_prefix". With --worker, `polykv-worker run --count-tokens` must
     agree on both lengths, or the task is an error.
  2. The context is prefilled once, uncompressed. KVzip's context
     reconstruction runs on that prefill (its scores do not depend on the
     ratio); every other press is applied to a copy of the full cache by
     replaying its forward hook on each layer's recorded inputs. That is what
     the press's hook does during a real prefill: kvpress compresses the cache
     only, the hidden states of the next layers come from the full cache.
  3. Each config answers greedily from its compressed cache, the question
     uncompressed and at its true positions (kvpress's pipeline does the same),
     and is teacher-forced on the full cache's answer: KL(full || config) over
     the whole vocabulary and top-1 agreement, per answer token.
The compressor never sees the question: the query-agnostic setting of the goal.

Configs are named like eval.py's: `full@1/f16` (the reference: no press) and
`kvpress-PRESS@KEEP/f16`, KEEP the fraction of the context's KV pairs kept
(kvpress's compression_ratio is 1 - KEEP). bytes_fraction counts what the
config holds at the end of the answer, at f16, against the full cache: kept
context pairs (per layer and KV head; masked pairs of AdaKV and KVzip are not
held) plus the question and answer, over context plus question and answer.

Files: this one prepares the tasks, writes the records and the report;
kvpress_engine.py is the model side (the only one that imports torch).

Output: OUT/results.jsonl (one record per (task, config), fields as
bench/eval/README.md "Record fields report.py reads"), OUT/scored.jsonl
(score.py), OUT/meta.json, and report.py's report.md / summary.json /
pareto.png. --resume skips the (task, config) pairs results.jsonl holds.

Usage (from the repository root):
  PY=$(scripts/setup-kvpress-venv.sh)
  $PY bench/anchor/kvpress_eval.py --out results/kvpress-test \\
      --tasks results/qwen-test-tasks/*.jsonl --worker build/bin/polykv-worker
"""
from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench", "eval"))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import eval as driver  # noqa: E402  (sha256_file, git_commit)
import live  # noqa: E402  (read_task, agreement: the task and measures as eval.py has them)
from kvpress_engine import Engine  # noqa: E402  (imports torch only when constructed)

REFERENCE = "full@1/f16"
DEFAULT_MODEL = os.path.expanduser("~/.cache/polykv/models/Qwen2.5-Coder-0.5B-Instruct.gguf")
# The strongest presses. Each name maps to a constructor in make_press.
PRESSES = ("streaming", "snapkv", "expected", "adakv-expected", "kvzip")
# KVzip's scores, selected other ways (kvpress_engine.py, TOKEN_SELECTIONS):
# kvpress's layerwise option, and selections polykv's paged tables can hold.
KVZIP_VARIANTS = ("kvzip-lw", "kvzip-layer", "kvzip-layervar", "kvzip-one")
DEFAULT_KEEP = (0.30, 0.25, 0.10)


def log(msg: str) -> None:
    print(f"[kvpress {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def die(msg: str) -> None:
    print(f"kvpress_eval: error: {msg}", file=sys.stderr)
    sys.exit(2)


def config_name(press: str, keep: float) -> str:
    return f"kvpress-{press}@{keep:g}/f16"


def parse_list(s: str, allowed=None, conv=str) -> list:
    out = []
    for x in (p.strip() for p in s.split(",")):
        if not x:
            continue
        v = conv(x)
        if allowed is not None and v not in allowed:
            die(f"unknown value {x!r} (one of {', '.join(allowed)})")
        out.append(v)
    return out


def parse_keep(s: str) -> list[float]:
    vals = parse_list(s, conv=float)
    for v in vals:
        if not 0 < v < 1:
            die(f"--keep {v:g}: a kept fraction must be in (0, 1)")
    return vals


def messages_of(task: "live.Task") -> tuple[list | None, list[dict]]:
    """(tools, messages) of the task up to (not including) the turn under
    test, as the worker renders them: role, content, tool_calls."""
    if task.generated_in_context:
        raise ValueError("the task generates earlier turns too; the anchor answers only the last")
    tools, out = None, []
    with open(task.file, encoding="utf-8") as f:
        for no, line in enumerate(f, 1):
            if no >= task.generation_line:
                break
            if not line.strip():
                continue
            o = json.loads(line)
            if "tools" in o:
                tools = o["tools"]
                continue
            out.append({k: o[k] for k in ("role", "content", "tool_calls") if k in o})
    return tools, out


def split_prompt(render, encode, msgs: list[dict], answer_prefix: str) -> tuple[list, list]:
    """(context ids, question ids). render(messages, generation_prompt) is the
    chat template, encode(text) the tokenizer. The context must be a token
    prefix of the whole prompt, or compressing "the context" would not be what
    the worker's cache holds."""
    if not msgs or msgs[-1].get("role") != "user":
        raise ValueError("the turn under test does not follow a user message (the question)")
    ctx_text = render(msgs[:-1], False)
    full_text = render(msgs, True)
    if not full_text.startswith(ctx_text):
        raise ValueError("the chat template renders the context differently with the question")
    ctx, full = encode(ctx_text), encode(full_text)
    if full[:len(ctx)] != ctx:
        raise ValueError("the context's tokens are not a prefix of the prompt's")
    return ctx, full[len(ctx):] + (encode(answer_prefix) if answer_prefix else [])


def bytes_fraction(kept_ctx: float, ctx: int, question: int, answer: int) -> float:
    """f16 bytes held at the end of the answer over the full cache's: kept_ctx
    is the kept fraction of the context's pairs (all layers, KV heads)."""
    total = ctx + question + answer
    return (kept_ctx * ctx + question + answer) / total if total else 1.0


def without_stop(tokens: list[int], stop_ids: set) -> list[int]:
    return tokens[:-1] if tokens and tokens[-1] in stop_ids else tokens


def worker_positions(worker: str, model: str, path: str) -> dict:
    """line -> position from `polykv-worker run --count-tokens`."""
    p = subprocess.run([worker, "run", "--count-tokens", "--model", model, path],
                       capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise RuntimeError(f"polykv-worker --count-tokens failed: {p.stderr.strip()[-300:]}")
    rows = [json.loads(x) for x in p.stdout.splitlines() if x.strip()]
    return {o["line"]: o["position"] for o in rows if "line" in o}  # the first row: geometry


def load_done(path: str) -> set:
    done = set()
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    r = json.loads(line)
                    if not r.get("error"):
                        done.add((r["task"], r["config"]))
    return done


def run_task(eng: Engine, task, configs: list[tuple[str, float]], done: set, args,
             emit, check_replay: bool) -> None:
    tools, msgs = messages_of(task)
    render = eng.renderer(tools)
    ctx_ids, q_ids = split_prompt(render, eng.encode, msgs, task.answer_prefix)
    worker_ctx = None
    if args.worker:
        # The whole prompt must match. The worker's position of the question
        # can be a few tokens earlier than the context here: it holds back a
        # message's last tokens until it knows how the template ends it.
        pos = worker_positions(args.worker, args.model, task.file)
        want, got = pos.get(task.generation_line), len(eng.encode(render(msgs, False)))
        worker_ctx = pos.get(task.question_line)
        if want != got or worker_ctx is None or not 0 <= len(ctx_ids) - worker_ctx <= 8:
            raise RuntimeError(f"token counts differ from polykv-worker's: prompt {got} here, "
                               f"{want} in the worker; context {len(ctx_ids)} here, {worker_ctx} "
                               "in the worker")
    with open(task.file, encoding="utf-8") as f:
        gen = json.loads([x for i, x in enumerate(f, 1) if i == task.generation_line][0])
    max_new = int(gen.get("max_new_tokens") or args.max_new_tokens)
    todo = [c for c in [(REFERENCE, 1.0)] + configs if (task.id, c[0]) not in done]
    if not todo:
        return
    kvzip_keeps = [k for (n, k) in configs if n.startswith("kvpress-kvzip")]
    t0 = time.time()
    full, recorded, kz = eng.prefill(ctx_ids, kvzip_keeps, args.out)
    prefill_s = time.time() - t0
    log(f"{task.id}: {len(ctx_ids)} context + {len(q_ids)} question tokens, prefill"
        f"{' and KVzip scoring' if kvzip_keeps else ''} {prefill_s:.0f} s")
    ctx = len(ctx_ids)
    ref_cache = copy.deepcopy(full)
    ref_tokens, _ = eng.answer(ref_cache, ctx, q_ids, max_new)
    ref_lp = eng.forced_logprobs(copy.deepcopy(full), ctx, q_ids, ref_tokens)
    base = {"task": task.id, "family": task.family, "file": task.file, "eval": task.eval,
            "mode": "kvpress", "context_tokens": ctx, "question_tokens": len(q_ids),
            "bytes_per_token_f16": eng.bytes_per_token_f16(), "answer_prefix": task.answer_prefix,
            "worker_context_tokens": worker_ctx, "kvpress_prefill_s": round(prefill_s, 2)}
    for name, keep in todo:
        t1 = time.time()
        if name == REFERENCE:
            tokens, kept = ref_tokens, 1.0
            measures = eng.forced_measures(ref_lp, ref_lp)
        else:
            press = name.split("@")[0][len("kvpress-"):]
            cache, kept = eng.compress(press, keep, full, recorded, kz)
            tf_cache = copy.deepcopy(cache)
            check = copy.deepcopy(cache) if check_replay and not press.startswith("kvzip") else None
            tokens, _ = eng.answer(cache, ctx, q_ids, max_new)
            measures = eng.forced_measures(ref_lp, eng.forced_logprobs(tf_cache, ctx, q_ids,
                                                                       ref_tokens))
            if check is not None:
                measures["replay_max_abs_diff"] = eng.replay_error(press, keep, ctx_ids, check)
                log(f"{task.id} {name}: the replay matches the press's own hook (masks equal, "
                    f"max |diff| {measures['replay_max_abs_diff']:.2e})")
            eng.clear_masks()
        # The worker's records list the answer without its stop token; the
        # teacher forcing above scores the stop token too, as the worker's does.
        shown, ref_shown = without_stop(tokens, eng.stop_ids), without_stop(ref_tokens, eng.stop_ids)
        a_prefix, a_token = live.agreement(ref_shown, shown)
        n_out = len(tokens)
        full_bytes = (ctx + len(q_ids) + n_out) * eng.bytes_per_token_f16()
        bf = bytes_fraction(kept, ctx, len(q_ids), n_out)
        rec = dict(base, config=name, policy=name.split("@")[0], budget=keep, formats="f16",
                   k_format="f16", v_format="f16", kept_context_fraction=round(kept, 6),
                   bytes_fraction=round(bf, 6), bytes_peak=round(bf * full_bytes),
                   bytes_full_f16=full_bytes,
                   output=task.answer_prefix + eng.decode(shown), output_tokens=shown,
                   stop="stop" if len(shown) < len(tokens) else "length",
                   ref_tokens_len=len(ref_shown), prefix_agreement=round(a_prefix, 6),
                   token_agreement=round(a_token, 6), kvpress_seconds=round(time.time() - t1, 2),
                   **measures)
        emit(rec)
        log(f"{task.id} {name}: kept {kept:.3f} of the context, bytes {bf:.3f}, "
            f"KL {measures['kl_mean']:.4f}, top-1 {measures['top1_agreement']:.3f}, "
            f"{time.time() - t1:.0f} s")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="See the module docstring (and bench/eval/README.md, "
                                        "'The kvpress anchor') for the method.")
    ap.add_argument("--tasks", nargs="+", required=True, help="task JSONL files")
    ap.add_argument("--out", required=True, help="output folder (created)")
    ap.add_argument("--model", default=DEFAULT_MODEL, help="Qwen2 GGUF (default: %(default)s)")
    ap.add_argument("--presses", default=",".join(PRESSES),
                    help="comma-separated, of: " + ", ".join(PRESSES + KVZIP_VARIANTS))
    ap.add_argument("--keep", default=",".join(f"{k:g}" for k in DEFAULT_KEEP),
                    help="kept fractions of the context (default %(default)s)")
    ap.add_argument("--worker", help="polykv-worker binary: check the token counts against it")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--max-new-tokens", type=int, default=160,
                    help="for tasks whose generation line sets none")
    ap.add_argument("--check-replay", action="store_true",
                    help="on the first task, also run each press (KVzip aside) through its own "
                         "hooks in a real prefill and require the replay to match (one prefill "
                         "per config)")
    ap.add_argument("--resume", action="store_true", help="keep OUT and skip what it holds")
    ap.add_argument("--no-plots", action="store_true", help="report without plots")
    args = ap.parse_args(argv)

    presses = parse_list(args.presses, PRESSES + KVZIP_VARIANTS)
    keeps = parse_keep(args.keep)
    configs = [(config_name(p, k), k) for p in presses for k in keeps]
    for f in args.tasks:
        if not os.path.isfile(f):
            die(f"task file {f} not found")
    if not os.path.isfile(args.model):
        die(f"model {args.model} not found (scripts/fetch-model.sh qwen2.5-coder-0.5b)")
    if args.worker and not os.access(args.worker, os.X_OK):
        die(f"--worker {args.worker} is not an executable")
    results = os.path.join(args.out, "results.jsonl")
    if os.path.exists(results) and not args.resume:
        die(f"{results} exists: pass --resume to add to it, or another --out")
    os.makedirs(args.out, exist_ok=True)
    done = load_done(results)
    tasks = [live.read_task(f) for f in args.tasks]

    try:
        eng = Engine(args.model, args.threads)
    except ValueError as e:
        die(str(e))
    log(f"model loaded in {eng.load_seconds:.0f} s ({eng.layers} layers, {eng.kv_heads} KV heads, "
        f"torch {eng.torch.__version__}, {eng.torch.get_num_threads()} threads)")
    import kvpress
    import torch
    import transformers
    meta = {"name": os.path.basename(os.path.normpath(args.out)), "mode": "kvpress",
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "command": " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]),
            "model": args.model, "model_sha256": driver.sha256_file(args.model),
            "git_commit": driver.git_commit(),
            "machine": {"cpus": os.cpu_count(), "cpu_model": platform.processor() or None},
            "matrix": [REFERENCE] + [c for c, _ in configs],
            "versions": {"kvpress": kvpress.__version__ if hasattr(kvpress, "__version__") else
                         _dist_version("kvpress"), "torch": torch.__version__,
                         "transformers": transformers.__version__},
            "tasks": [os.path.relpath(t.file, ROOT) for t in tasks]}
    with open(os.path.join(args.out, "meta.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=1)

    t_start = time.time()
    with open(results, "a", encoding="utf-8") as out:
        def emit(rec):
            out.write(json.dumps(rec, ensure_ascii=False) + "\n")
            out.flush()

        for i, task in enumerate(tasks):
            log(f"task {i + 1}/{len(tasks)}: {task.id} (elapsed {time.time() - t_start:.0f} s)")
            try:
                with torch.inference_mode():
                    run_task(eng, task, configs, done, args, emit,
                             args.check_replay and i == 0)
            except (RuntimeError, ValueError) as e:
                log(f"{task.id}: error: {e}")
                for name, keep in [(REFERENCE, 1.0)] + configs:
                    if (task.id, name) not in done:
                        emit({"task": task.id, "family": task.family, "config": name,
                              "mode": "kvpress", "error": str(e)})
    finish(args.out, not args.no_plots)
    log(f"done in {time.time() - t_start:.0f} s: {os.path.join(args.out, 'report.md')}")
    return 0


def _dist_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def finish(out_dir: str, plots: bool) -> None:
    """scored.jsonl (score.py) and report.py's report of it."""
    import report
    import score
    rows = report.load_records(os.path.join(out_dir, "results.jsonl"))
    with open(os.path.join(out_dir, "scored.jsonl"), "w", encoding="utf-8") as f:
        for r in rows:
            if r.get("eval") and "output" in r:
                s = score.score(r["eval"], r["output"])
                r["success"], r["score_detail"] = s["success"], s["detail"]
            else:
                r["success"] = None
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    report.write_report(out_dir, plots=plots)


if __name__ == "__main__":
    sys.exit(main())
