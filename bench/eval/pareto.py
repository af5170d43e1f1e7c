#!/usr/bin/env python3
"""Relative task success vs bytes for several evaluation runs on one plot, with
the goal of issue [fidelity] drawn in: polykv's configs beside an anchor's (the
kvpress presses of bench/anchor/kvpress_eval.py), each run scored against its
own full-cache reference.

Reads each RUN/summary.json (report.py's); writes the PNG and prints a markdown
table of every config plotted (bytes, relative success, KL and top-1 with their
95% CIs) on stdout.

Usage: python3 bench/eval/pareto.py --out pareto.png RUN[=LABEL] [RUN[=LABEL] ...]
         [--title TEXT]
Needs matplotlib (eval.py's venv, or the kvpress venv).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report  # noqa: E402

# Issue [fidelity]'s goal: (bytes fraction, relative success) to reach.
GOALS = ((0.25, 0.99), (0.10, 0.97))
MARKERS = ["o", "s", "^", "v", "D", "X", "P", "*", "h", "<", ">"]
RUN_COLORS = ["tab:blue", "tab:red", "tab:green", "tab:purple", "tab:orange", "tab:brown"]


def load_run(arg: str) -> tuple[str, list[dict]]:
    path, _, label = arg.partition("=")
    f = os.path.join(path, "summary.json")
    if not os.path.exists(f):
        raise SystemExit(f"pareto: {f} not found (run report.py on {path} first)")
    with open(f, encoding="utf-8") as fh:
        s = json.load(fh)
    return label or os.path.basename(os.path.normpath(path)), s.get("configs") or []


def points(configs: list[dict]) -> list[dict]:
    """Configs with a relative success and a bytes fraction, the reference left out."""
    out = []
    for c in configs:
        rs = c.get("rel_success") or {}
        if c.get("reference") or rs.get("value") is None or not c.get("bytes_fraction"):
            continue
        out.append(c)
    return out


def family(config: str) -> str:
    """'kvpress-snapkv@0.3/f16' -> 'kvpress-snapkv/f16'."""
    policy, _, rest = config.partition("@")
    _, _, formats = rest.partition("/")
    return f"{policy}/{formats}" if formats else policy


def est(e: dict | None, d: int = 3) -> str:
    if not e or e.get("value") is None:
        return "n/a"
    if e.get("lo") is None:
        return f"{e['value']:.{d}f}"
    return f"{e['value']:.{d}f} [{e['lo']:.{d}f}, {e['hi']:.{d}f}]"


def table(runs: list[tuple[str, list[dict]]]) -> str:
    rows = []
    for label, cs in runs:
        for c in sorted(points(cs), key=lambda c: c["bytes_fraction"]):
            rows.append([label, f"`{c['config']}`", f"{c['bytes_fraction']:.3f}",
                         est(c.get("rel_success")), est(c.get("kl"), 4), est(c.get("top1"))])
    return "\n".join(report.md_table(
        ["run", "config", "bytes", "rel. success [95% CI]", "KL nats/token [95% CI]",
         "top-1 [95% CI]"], rows))


def plot(runs: list[tuple[str, list[dict]]], out: str, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, ax = plt.subplots(figsize=(11, 6))
    every = []
    for i, (label, cs) in enumerate(runs):
        color = RUN_COLORS[i % len(RUN_COLORS)]
        # One marker per config family (the name without its budget), so one
        # press or format at several budgets reads as one series.
        families = []
        for c in points(cs):
            if family(c["config"]) not in families:
                families.append(family(c["config"]))
        for c in points(cs):
            rs, x = c["rel_success"], c["bytes_fraction"]
            yerr = None
            if rs.get("lo") is not None:
                yerr = [[max(rs["value"] - rs["lo"], 0)], [max(rs["hi"] - rs["value"], 0)]]
            m = MARKERS[families.index(family(c["config"])) % len(MARKERS)]
            ax.errorbar([x], [rs["value"]], yerr=yerr, fmt=m, color=color, ms=6,
                        elinewidth=0.8, capsize=2, alpha=0.8)
            every.append((x, rs["value"]))
        for j, f in enumerate(families):
            ax.plot([], [], MARKERS[j % len(MARKERS)], color=color, label=f"{label}: {f}")
    if every:
        front = report.pareto_front(every)
        xs = [p[0] for p in front] + [max(p[0] for p in every)]
        ax.step(xs, [p[1] for p in front] + [front[-1][1]], where="post", color="black",
                lw=1, ls="--", label="Pareto front (all runs)")
    for gx, gy in GOALS:
        ax.plot([gx], [gy], marker="*", ms=14, color="green", ls="",
                label=f"goal: ≥ {gy:g} at {gx:.0%} of the bytes")
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel("bytes: fraction of the full-f16 peak (log scale)")
    ax.set_ylabel("relative task success (95% paired bootstrap CI)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(out, dpi=120, bbox_inches="tight")
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", metavar="RUN[=LABEL]", help="run folders with summary.json")
    ap.add_argument("--out", required=True, help="the PNG to write")
    ap.add_argument("--title", default="relative task success vs memory")
    args = ap.parse_args(argv)
    runs = [load_run(r) for r in args.runs]
    if not any(points(cs) for _, cs in runs):
        raise SystemExit("pareto: no config with a relative success and a bytes fraction")
    plot(runs, args.out, args.title)
    print(table(runs))
    print(f"pareto: wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
