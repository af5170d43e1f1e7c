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

A subset, or a run that reuses records already measured (a committed
docs/results folder keeps records only, so its tasks are regenerated with
the command in its README and named with --tasks):

  python3 bench/eval/solved.py docs/results/D/test-solved/scored.jsonl.gz \\
      results/sub --tasks results/regen/tasks --only docs/results/D/sub/manifest.json \\
      --records docs/results/D/test-solved/scored.jsonl.gz

The records must come from the model the resumed run uses; eval.py
--resume skips the (task, config) pairs they hold.
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


def read_any(path: str) -> dict[tuple[str, str], dict]:
    """The live records of a results.jsonl or a scored.jsonl[.gz]."""
    try:
        return live.read_records(path, "solved.py reads live runs only")
    except live.LiveError as e:
        raise SystemExit(str(e)) from None


def records_path(src: str) -> str:
    """SRC as a records file: a run folder's results.jsonl, or SRC itself."""
    path = os.path.join(src, "results.jsonl") if os.path.isdir(src) else src
    if not os.path.isfile(path):
        sys.exit(f"{path}: no such file (give a run folder or a records file)")
    return path


def worker_files(records_file: str, agent: str) -> list[str]:
    """The worker files of a record: its answer, log-probabilities and
    forced pass, when the records sit in a run folder (committed records
    come without them)."""
    folder = os.path.join(os.path.dirname(records_file), "live")
    if not os.path.isdir(folder):
        return []
    return [os.path.join(folder, f) for f in sorted(os.listdir(folder))
            if f.startswith(agent + ".")]


def task_eval(path: str, task: str) -> dict | None:
    """The eval block of the turn that asks task's question."""
    with open(path) as f:
        for line in f:
            o = json.loads(line)
            if o.get("id") == task:
                return o.get("eval")
    return None


class Tasks:
    """Task files and manifest entries looked up across folders, first one
    wins."""

    def __init__(self, dirs: list[str]):
        self.files: dict[str, str] = {}
        self.entries: dict[str, dict] = {}
        for d in dirs:
            if not os.path.isdir(d):
                sys.exit(f"{d}: no such folder of tasks")
            for name in sorted(os.listdir(d)):
                if name.endswith(".jsonl"):
                    self.files.setdefault(name, os.path.join(d, name))
            manifest = os.path.join(d, "manifest.json")
            if os.path.isfile(manifest):
                with open(manifest) as f:
                    for e in json.load(f):
                        self.entries.setdefault(e.get("file"), e)

    def find(self, record: dict) -> str:
        """The task file a record was measured on; exits when it is missing
        or asks another question (regenerated with another seed or gen)."""
        name = os.path.basename(record["file"])
        path = self.files.get(name)
        if path is None:
            sys.exit(f"{name}: not in the task folders (regenerate the tasks, --tasks DIR)")
        if task_eval(path, record["task"]) != record.get("eval"):
            sys.exit(f"{path}: not the task {record['task']} was measured on "
                     "(its question's eval block differs)")
        return path


def listed(manifest: str) -> set[str]:
    """The task file names a manifest.json lists."""
    try:
        with open(manifest) as f:
            return {e["file"] for e in json.load(f)}
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit(f"{manifest}: not a manifest.json ({e})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", help="a live run's folder (results/NAME), or a records file: "
                    "results.jsonl, scored.jsonl or scored.jsonl.gz")
    ap.add_argument("dst", help="the new run's folder; must not exist")
    ap.add_argument("--tasks", action="append", metavar="DIR",
                    help="a folder of task files (repeatable; default SRC/tasks)")
    ap.add_argument("--only", metavar="MANIFEST",
                    help="keep only the solved tasks this manifest.json lists (each must be solved)")
    ap.add_argument("--records", action="append", default=[], metavar="FILE",
                    help="records of other configs on these tasks, same model, to carry over "
                    "(repeatable; later files win a (task, config) pair; SRC's references "
                    "are kept)")
    args = ap.parse_args(argv)

    results = records_path(args.src)
    if os.path.exists(args.dst):
        sys.exit(f"{args.dst} exists: give a new folder")
    task_dirs = args.tasks or [os.path.join(os.path.dirname(results), "tasks")]
    tasks = Tasks(task_dirs)
    refs = {t: r for (t, c), r in read_any(results).items() if c == live.REFERENCE}
    solved, unsolved, failed = [], [], []
    by_family: dict[str, list[int]] = {}  # family: [solved, answered]
    for tid, r in sorted(refs.items()):
        if r.get("error"):
            failed.append(tid)
            continue
        ok = bool(score.score_record(r)["success"])
        (solved.append(r) if ok else unsolved.append(tid))
        counts = by_family.setdefault(r["family"], [0, 0])
        counts[0] += ok
        counts[1] += 1
    if not solved:
        sys.exit(f"the reference solves none of the {len(refs)} tasks in {results}")
    summary = (f"{len(solved)} of {len(refs)} tasks solved by {live.REFERENCE} "
               f"({len(unsolved)} not, {len(failed)} with errors): "
               + ", ".join(f"{fam} {a}/{n}" for fam, (a, n) in sorted(by_family.items())))
    if args.only:
        want = listed(args.only)
        missing = sorted(want - {os.path.basename(r["file"]) for r in solved})
        if missing:
            sys.exit(f"{args.only} lists tasks {results}'s reference does not solve "
                     f"(or does not have): {', '.join(missing)}")
        solved = [r for r in solved if os.path.basename(r["file"]) in want]

    # Every check before the first write: a refused cut leaves no DST.
    kept = {r["task"]: tasks.find(r) for r in solved}
    carried = [(results, r) for r in solved]
    for path in args.records:
        for (tid, config), r in read_any(records_path(path)).items():
            if tid in kept and config != live.REFERENCE:  # SRC's references decided the cut
                if tasks.find(r) != kept[tid]:
                    sys.exit(f"{path}: {tid} was measured on another task file")
                carried.append((path, r))
    pairs: dict[tuple[str, str], tuple[str, dict]] = {}
    for path, r in carried:
        pairs[(r["task"], r["config"])] = (path, r)

    dst_tasks, dst_live = os.path.join(args.dst, "tasks"), os.path.join(args.dst, "live")
    os.makedirs(dst_tasks)
    os.makedirs(dst_live)
    for path in kept.values():
        shutil.copy2(path, os.path.join(dst_tasks, os.path.basename(path)))
    names = {os.path.basename(p) for p in kept.values()}
    entries = [e for n, e in tasks.entries.items() if n in names]  # the manifests' order
    if entries:
        with open(os.path.join(dst_tasks, "manifest.json"), "w") as f:
            json.dump(entries, f, indent=1)
            f.write("\n")
    out = []
    for path, r in pairs.values():
        r = dict(r, file=os.path.join(dst_tasks, os.path.basename(r["file"])))
        # Scoring adds these; the resumed run scores every record again.
        r.pop("success", None)
        r.pop("score_detail", None)
        for f in worker_files(path, r["agent"]):
            shutil.copy2(f, os.path.join(dst_live, os.path.basename(f)))
        out.append(r)
    live.write_records(os.path.join(args.dst, "results.jsonl"), out)

    print(summary)
    configs = sorted({c for _, c in pairs})
    print(f"wrote {args.dst}: {len(kept)} tasks, {len(out)} records "
          f"({len(configs)} configs: {', '.join(configs)}), live/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
