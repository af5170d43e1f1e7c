#!/usr/bin/env python3
"""Harness vs live: the same tasks and configs through polykv-eval and through
eval.py --live, side by side.

  python3 bench/eval/compare_live.py results/mini results/mini-live [-o compare.md]

Each argument is a results folder (its scored.jsonl, else results.jsonl,
scored here) or a JSONL file of records. Per config, over the tasks both
runs have:

  rel. success   mean(success) / mean(success of full@1/f16) within each path
                 (over the tasks where both are scored), as report.py does
  token agr.     token agreement with that path's own reference full@1/f16
  bytes frac.    bytes_peak / the path's reference bytes_peak (harness: after
                 its one compaction; live: the session's peak, before one)
  same answer    fraction of tasks whose answer tokens are identical in both
                 paths (records with an error count as different)
  errors         records with an error, harness / live

Writes the markdown table to stdout (and to -o FILE).
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import report  # noqa: E402
import score  # noqa: E402
import stats  # noqa: E402

REFERENCE = "full@1/f16"


def load(path: str) -> dict:
    """{(task, config): scored record} from a results folder or a JSONL file."""
    if os.path.isdir(path):
        scored = os.path.join(path, "scored.jsonl")
        path = scored if os.path.exists(scored) else os.path.join(path, "results.jsonl")
    records = report.load_records(path)
    out = {}
    for r in records:
        if "success" not in r:
            r = score.score_record(r)
        out[(r.get("task"), r.get("config"))] = r
    return out


def _success(r: dict):
    return report._success(r.get("success"))


def rel_success(recs: dict, tasks: list, config: str):
    """mean(success of config) / mean(success of the reference), paired over
    the tasks where both are scored; None when undefined."""
    num, den = [], []
    for t in tasks:
        a, b = recs.get((t, config)), recs.get((t, REFERENCE))
        if a is None or b is None:
            continue
        sa, sb = _success(a), _success(b)
        if sa is None or sb is None:
            continue
        num.append(sa)
        den.append(sb)
    m = stats.mean(den)
    return (stats.mean(num) / m if m else None), len(num)


def mean_field(recs: dict, tasks: list, config: str, key: str, derive=None):
    vals = []
    for t in tasks:
        r = recs.get((t, config))
        if r is None:
            continue
        v = report._num(r.get(key))
        if v is None and derive is not None:
            v = derive(r, recs.get((t, REFERENCE)))
        if v is not None:
            vals.append(v)
    return stats.mean(vals)


def _bytes_fraction(r: dict, ref: dict | None):
    peak = report._num(r.get("bytes_peak"))
    full = report._num(r.get("bytes_full_f16")) or (ref and report._num(ref.get("bytes_peak")))
    return peak / full if peak is not None and full else None


def same_answer(h: dict, l: dict, tasks: list, config: str):
    n = same = 0
    for t in tasks:
        a, b = h.get((t, config)), l.get((t, config))
        if a is None or b is None:
            continue
        n += 1
        if (not a.get("error") and not b.get("error") and a.get("output_tokens") is not None
                and a.get("output_tokens") == b.get("output_tokens")):
            same += 1
    return (same / n if n else None), n


def compare(h: dict, l: dict) -> tuple[list[str], list[list[str]]]:
    """The table's header and rows, configs in the live run's order (the
    reference first)."""
    order = []
    for _, c in list(l) + list(h):
        if c not in order:
            order.append(c)
    order.sort(key=lambda c: c != REFERENCE)
    header = ["config", "tasks", "rel. success harness", "rel. success live",
              "token agr. harness", "token agr. live", "KL harness", "KL live",
              "top-1 harness", "top-1 live", "bytes frac. harness",
              "bytes frac. live", "same answer", "errors h/l"]
    rows = []
    for c in order:
        tasks = sorted({t for t, cc in h if cc == c} & {t for t, cc in l if cc == c})
        if not tasks:
            continue
        rh, _ = rel_success(h, tasks, c)
        rl, _ = rel_success(l, tasks, c)
        sa, n = same_answer(h, l, tasks, c)
        eh = sum(1 for t in tasks if h[(t, c)].get("error"))
        el = sum(1 for t in tasks if l[(t, c)].get("error"))
        rows.append([c, str(n), report.fmt(rh), report.fmt(rl),
                     report.fmt(mean_field(h, tasks, c, "token_agreement")),
                     report.fmt(mean_field(l, tasks, c, "token_agreement")),
                     report.fmt(mean_field(h, tasks, c, "kl_mean"), 4),
                     report.fmt(mean_field(l, tasks, c, "kl_mean"), 4),
                     report.fmt(mean_field(h, tasks, c, "top1_agreement")),
                     report.fmt(mean_field(l, tasks, c, "top1_agreement")),
                     report.fmt(mean_field(h, tasks, c, "bytes_fraction", _bytes_fraction)),
                     report.fmt(mean_field(l, tasks, c, "bytes_fraction", _bytes_fraction)),
                     report.fmt(sa, 2), f"{eh}/{el}"])
    return header, rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("harness", help="polykv-eval results: a results folder or a JSONL file")
    ap.add_argument("live", help="eval.py --live results: a results folder or a JSONL file")
    ap.add_argument("-o", "--output", help="also write the markdown here")
    args = ap.parse_args(argv)
    h, l = load(args.harness), load(args.live)
    if any(r.get("mode") == "live" for r in h.values()):
        print(f"compare_live: warning: {args.harness} holds live records", file=sys.stderr)
    if not any(r.get("mode") == "live" for r in l.values()):
        print(f"compare_live: warning: {args.live} holds no live records", file=sys.stderr)
    header, rows = compare(h, l)
    if not rows:
        print("compare_live: the two runs share no (task, config)", file=sys.stderr)
        return 1
    md = "\n".join([f"Harness `{args.harness}` vs live `{args.live}`:", ""]
                   + report.md_table(header, rows)) + "\n"
    sys.stdout.write(md)
    if args.output:
        with open(args.output, "w") as f:
            f.write(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
