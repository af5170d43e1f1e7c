#!/usr/bin/env python3
"""Runs one polykv-bench subcommand and checks what it prints with --json: an
object holding the named sections, every number in it finite. A smoke test
(the benchmarks' code paths run and report), not a timing: CI machines are
too noisy for thresholds, and performance is read from bench/ runs.

usage: check_bench_json.py BENCH_BINARY KEY,KEY,... -- SUBCOMMAND ARGS...
"""
import json
import math
import subprocess
import sys


def numbers(x, path=""):
    if isinstance(x, bool):
        return
    if isinstance(x, (int, float)):
        yield path, x
    elif isinstance(x, dict):
        for k, v in x.items():
            yield from numbers(v, f"{path}/{k}")
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from numbers(v, f"{path}/{i}")


def main() -> int:
    if len(sys.argv) < 4 or sys.argv[3] != "--":
        print(__doc__, file=sys.stderr)
        return 2
    binary, keys, cmd = sys.argv[1], sys.argv[2].split(","), sys.argv[4:]
    p = subprocess.run([binary, *cmd, "--json"], capture_output=True, text=True)
    if p.returncode != 0:
        print(f"polykv-bench {' '.join(cmd)} exited {p.returncode}:\n{p.stderr[-2000:]}")
        return 1
    out = json.loads(p.stdout)
    if not isinstance(out, dict):
        print(f"expected a JSON object, got {type(out).__name__}")
        return 1
    missing = [k for k in keys if k not in out]
    bad = [f"{path} = {v}" for path, v in numbers(out) if not math.isfinite(v)]
    for what, items in (("missing sections", missing), ("numbers not finite", bad)):
        if items:
            print(f"polykv-bench {' '.join(cmd)}: {what}: {', '.join(items[:10])}")
    return 1 if missing or bad else 0


if __name__ == "__main__":
    sys.exit(main())
