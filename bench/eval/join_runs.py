#!/usr/bin/env python3
"""Joins the scored records of several runs into one folder for report.py.

A split screened in more than one run (another seed for more tasks: each run
numbers its tasks from 000, so their ids overlap) is scored as one: every
record's task id is prefixed with its run's label (`LABEL/longagent-000`), so
the report pairs configs within each task and resamples over all of them.
The runs must share the model (sha256) and the reference config; meta.json
keeps each run's command, seed, commit and wall time under "runs".

  python3 bench/eval/join_runs.py results/joined results/s2-solved results/s4-solved
  python3 bench/eval/report.py results/joined

A RUN is a folder holding scored.jsonl or scored.jsonl.gz (and meta.json);
its label is the folder's name unless given as LABEL=FOLDER. DST must not
exist; nothing is written when a run is refused.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import live  # noqa: E402

# Settings of a run's meta.json the report reads; runs that disagree on one
# cannot be reported as one.
SHARED_META = ("model_sha256", "bytes_per_token_f16", "static_session_bytes",
               "max_context_tokens")


def fail(msg: str):
    raise SystemExit(f"join_runs: {msg}")


def read_run(folder: str) -> tuple[list[dict], dict]:
    for name in ("scored.jsonl", "scored.jsonl.gz"):
        path = os.path.join(folder, name)
        if os.path.exists(path):
            try:
                records = list(live.read_records(path, "join_runs.py joins live runs").values())
            except live.LiveError as e:
                fail(str(e))
            break
    else:
        fail(f"{folder}: no scored.jsonl or scored.jsonl.gz (run score.py, or eval.py)")
    meta_path = os.path.join(folder, "meta.json")
    if not os.path.exists(meta_path):
        fail(f"{folder}: no meta.json")
    with open(meta_path, encoding="utf-8") as f:
        return records, json.load(f)


def join(runs: list[tuple[str, str]], dst: str) -> tuple[list[dict], dict]:
    labels = [label for label, _ in runs]
    if len(set(labels)) != len(labels):
        fail(f"labels must differ: {', '.join(labels)}")
    records, metas = [], []
    for label, folder in runs:
        recs, meta = read_run(folder)
        if not recs:
            fail(f"{folder}: no records")
        records += [dict(r, task=f"{label}/{r['task']}") for r in recs]
        metas.append((label, folder, meta))
    first = metas[0][2]
    for key in SHARED_META:
        values = {json.dumps(m.get(key)) for _, _, m in metas}
        if len(values) > 1:
            fail(f"the runs differ in meta.json {key}: "
                 + "; ".join(f"{lbl}: {m.get(key)}" for lbl, _, m in metas))
    refs = {m.get("reference") for _, _, m in metas if m.get("reference")}
    if len(refs) > 1:
        fail(f"the runs have different references: {', '.join(sorted(refs))}")
    meta = {k: first[k] for k in SHARED_META + ("model", "machine", "reference", "matrix")
            if k in first}
    meta.update({
        "name": os.path.basename(os.path.normpath(dst)),
        "command": "python3 bench/eval/join_runs.py " + " ".join(
            [dst] + [f"{lbl}={folder}" for lbl, folder, _ in metas]),
        "date": max(str(m.get("date", "")) for _, _, m in metas),
        "split": "/".join(sorted({str(m.get("split")) for _, _, m in metas})),
        "seed": ", ".join(str(m.get("seed")) for _, _, m in metas),
        "git_commit": ", ".join(sorted({str(m.get("git_commit")) for _, _, m in metas})),
        "wall_seconds": sum(float(m.get("wall_seconds") or 0) for _, _, m in metas),
        "runs": [{"label": lbl, "folder": folder,
                  **{k: m.get(k) for k in ("name", "command", "seed", "split", "git_commit",
                                           "date", "wall_seconds")}}
                 for lbl, folder, m in metas],
    })
    return records, meta


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dst", help="the joined folder; must not exist")
    ap.add_argument("runs", nargs="+", metavar="RUN", help="FOLDER or LABEL=FOLDER")
    args = ap.parse_args(argv)
    if len(args.runs) < 2:
        fail("join needs two runs or more")
    if os.path.exists(args.dst):
        fail(f"{args.dst} exists")
    runs = []
    for spec in args.runs:
        label, sep, folder = spec.partition("=")
        if not sep:
            folder, label = spec, os.path.basename(os.path.normpath(spec))
        if not label or "/" in label:
            fail(f"bad label in {spec!r}")
        runs.append((label, folder))
    records, meta = join(runs, args.dst)
    os.makedirs(args.dst)
    with open(os.path.join(args.dst, "scored.jsonl"), "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    with open(os.path.join(args.dst, "meta.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=1, ensure_ascii=False)
        f.write("\n")
    tasks = {r["task"] for r in records}
    print(f"wrote {args.dst}: {len(records)} records, {len(tasks)} tasks from {len(runs)} runs",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
