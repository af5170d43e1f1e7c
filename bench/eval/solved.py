#!/usr/bin/env python3
"""Starts a live run on the tasks that the reference of another run solves.

A screen answers every task of a split under the reference alone, and
cheaply (no teacher forcing):

  python3 bench/eval/eval.py --live --name screen --split test \\
      --configs full@1/f16 --no-teacher-force ...

Relative success and KL only mean something on the tasks that the full
cache gets right, so the configs then run on those only:

  python3 bench/eval/solved.py results/screen results/screen-solved
  python3 bench/eval/eval.py --live --resume --name screen-solved \\
      --configs "full@1/f16,kvzip@0.25/K4V4/T64" ...

DST gets the solved tasks (files and manifest entries), their reference
records and the reference's worker files. Without teacher forcing in the
screen, the resumed run gives each reference its forced pass first (the
distributions the other configs are scored against). SRC is not changed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import live  # noqa: E402
import score  # noqa: E402


def reference_records(results: str) -> dict[str, dict]:
    """The last reference record of each task in a live results.jsonl."""
    try:
        records = live.read_records(results, "solved.py reads live runs only")
    except live.LiveError as e:
        raise SystemExit(str(e)) from None
    return {task: r for (task, config), r in records.items() if config == live.REFERENCE}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", help="a live run's folder (results/NAME)")
    ap.add_argument("dst", help="the new run's folder; must not exist")
    args = ap.parse_args(argv)

    results = os.path.join(args.src, "results.jsonl")
    if not os.path.isfile(results):
        sys.exit(f"{results}: no such file (is {args.src} a run folder?)")
    if os.path.exists(args.dst):
        sys.exit(f"{args.dst} exists: give a new folder")
    refs = reference_records(results)
    solved, unsolved, failed = [], [], []
    by_family: dict[str, list[int]] = {}  # family: [solved, answered]
    for tid, r in sorted(refs.items()):
        if r.get("error"):
            failed.append(tid)
            continue
        ok = bool(score.score_record(r)["success"])
        if ok:
            solved.append(r)
        else:
            unsolved.append(tid)
        counts = by_family.setdefault(r["family"], [0, 0])
        counts[0] += ok
        counts[1] += 1
    if not solved:
        sys.exit(f"the reference solves none of the {len(refs)} tasks in {results}")

    src_tasks, dst_tasks = os.path.join(args.src, "tasks"), os.path.join(args.dst, "tasks")
    dst_live = os.path.join(args.dst, "live")
    os.makedirs(dst_tasks)
    os.makedirs(dst_live)
    names = set()
    for r in solved:
        name = os.path.basename(r["file"])
        shutil.copy2(os.path.join(src_tasks, name), os.path.join(dst_tasks, name))
        r["file"] = os.path.join(dst_tasks, name)
        names.add(name)
        # The reference's worker files: its answer, log-probabilities and,
        # when the screen forced it, the forced pass.
        agent = r["agent"]
        for f in os.listdir(os.path.join(args.src, "live")):
            if f.startswith(agent + "."):
                shutil.copy2(os.path.join(args.src, "live", f), os.path.join(dst_live, f))
    manifest = os.path.join(src_tasks, "manifest.json")
    if os.path.isfile(manifest):
        with open(manifest) as f:
            entries = [e for e in json.load(f) if e.get("file") in names]
        with open(os.path.join(dst_tasks, "manifest.json"), "w") as f:
            json.dump(entries, f, indent=1)
            f.write("\n")
    live.write_records(os.path.join(args.dst, "results.jsonl"), solved)

    print(f"{len(solved)} of {len(refs)} tasks solved by {live.REFERENCE} "
          f"({len(unsolved)} not, {len(failed)} with errors): "
          + ", ".join(f"{fam} {a}/{n}" for fam, (a, n) in sorted(by_family.items())))
    print(f"wrote {args.dst}: tasks/, results.jsonl (the references), live/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
