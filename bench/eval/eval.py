#!/usr/bin/env python3
"""One command for the agentic evaluation: build, tasks, run, score, report.

  python3 bench/eval/eval.py --preset quick
  python3 bench/eval/eval.py --preset full --name full-2024-06
  python3 bench/eval/eval.py --preset quick --families recall tools --per-family 1 \\
      --configs "full@1/f16,hybrid@0.1/K8V4" --skip-build
  python3 bench/eval/eval.py --preset quick --workload my_script.json --name mine

Every (task, config) runs on the product path: a polykv-worker on a live
polykvd, the config set as the agent's QoS (bench/eval/live.py). Everything
lands in OUT/NAME/ (default results/<preset>/): tasks/, configs.txt,
results.jsonl, scored.jsonl, meta.json, report.md, summary.json, *.png,
polykvd.log, polykvd_metrics.txt and live/ (each worker's output).
Stdlib only: the plotting dependencies live in a venv this script creates
(${POLYKV_EVAL_VENV:-~/.cache/polykv/eval-venv}) and report.py runs in it.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import live  # noqa: E402  (bench/eval/live.py: the run)

# ===========================================================================
# PRESETS — the one place to tune run size. Edit freely after timing a run.
#
#   families    task families passed to gen.py
#   per_family  tasks per family; "*" is the default for families not named
#   min_tokens, max_tokens   shared-context length range for gen.py
#   configs     "policy@budget/formats" (live.parse_config's grammar); the
#               reference full@1/f16 must stay in every preset (report.py
#               divides by it)
# ===========================================================================
FAMILIES = ["recall", "coding", "tools", "bfcl", "humaneval", "multiagent"]
# Families no preset runs: only when --families names them (6K-12K tokens).
LONG_FAMILIES = ["longagent"]

_QUICK_CONFIGS = [
    "full@1/f16",
    # every policy at one budget, f16
    "window@0.25/f16", "streaming@0.25/f16", "h2o@0.25/f16", "snapkv@0.25/f16",
    "hybrid@0.25/f16", "structural@0.25/f16", "intent@0.25/f16", "merge@0.25/f16",
    # one policy: a smaller budget, then formats at the same budget
    "hybrid@0.1/f16", "hybrid@0.25/K8V4", "hybrid@0.25/K4V8", "hybrid@0.25/K4V4",
    "hybrid@0.25/K2V2",
]

_FULL_POLICIES = ["window", "streaming", "h2o", "snapkv", "hybrid", "merge", "structural",
                  "intent", "sinks+structural+intent"]
_FULL_BUDGETS = ["0.5", "0.25", "0.1", "0.05"]
# Formats are crossed with one policy only: on 2 cores every configuration
# costs ~1-2 s of decode per task (its answer is generated anew), and which
# bits a page keeps is close to orthogonal to which tokens are kept.
_FULL_FORMAT_POLICY = "hybrid"
_FULL_FORMAT_BUDGETS = ["0.25", "0.1", "0.05"]
_QUANT_FORMATS = ["K8V4", "K4V8", "K4V4", "K2V2"]

_FULL_CONFIGS = (
    ["full@1/f16"]
    + [f"{p}@{b}/f16" for p in _FULL_POLICIES for b in _FULL_BUDGETS]
    + [f"{_FULL_FORMAT_POLICY}@{b}/{f}" for f in _QUANT_FORMATS for b in _FULL_FORMAT_BUDGETS]
    # formats alone, no eviction: what quantization costs by itself
    + [f"full@1/{f}" for f in _QUANT_FORMATS]
)

PRESETS = {
    # 11 tasks x 14 configurations: 4 min 42 s end to end on 2 cores with the
    # in-process harness (2026-11-30); a live run re-prefills every (task,
    # config) pair and takes about 6x that.
    "quick": {
        "families": FAMILIES,
        "per_family": {"*": 1, "recall": 2, "tools": 2, "multiagent": 4},
        "min_tokens": 1500, "max_tokens": 2500,
        "configs": _QUICK_CONFIGS,
    },
    # 39 tasks x 53 configurations: 47 min end to end on 2 cores with the
    # in-process harness (2026-11-30, docs/results/full-2026-11-30); live,
    # hours. One HumanEval task: its 160-token answers cost ~4-6 s per
    # configuration.
    "full": {
        "families": FAMILIES,
        "per_family": {"*": 4, "recall": 8, "tools": 6, "humaneval": 1, "multiagent": 16},
        "min_tokens": 2000, "max_tokens": 3000,
        "configs": _FULL_CONFIGS,
    },
}
# ===========================================================================

# Families whose tasks gen.py builds from downloaded public data (data.py).
DATA_FAMILIES = {"bfcl", "humaneval"}
# gen.py's --families takes one comma-separated argument.
GEN_FAMILIES_SEP = ","
# SmolLM2-135M: 30 layers x (K, V) x 3 KV heads x 64 head dim x 2 bytes (f16).
# Used only when the records do not report bytes_per_token_f16.
SMOLLM2_BYTES_PER_TOKEN_F16 = 30 * 2 * 3 * 64 * 2
MAX_CONTEXT_TOKENS = 8192  # what a static allocator would reserve per session

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EVAL_DIR = os.path.join(ROOT, "bench", "eval")
BIN_DIR = os.path.join(ROOT, "build", "bin")
BENCH = os.path.join(BIN_DIR, "polykv-bench")
# polykv-bench capacity takes seconds; a run far past that is stuck, and the
# evaluation's results should not wait on it.
CAPACITY_TIMEOUT_S = 600
CAPACITY_FORMATS = set(live.PAGE_FORMATS)
HOME_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "polykv")

_T0 = time.monotonic()
_STEP = [0, 0]


def elapsed() -> str:
    s = int(time.monotonic() - _T0)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def log(msg: str) -> None:
    print(f"[eval {elapsed()}] {msg}", file=sys.stderr, flush=True)


def step(msg: str) -> None:
    _STEP[0] += 1
    log(f"({_STEP[0]}/{_STEP[1]}) {msg}")


def die(msg: str) -> "NoReturn":  # noqa: F821
    print(f"[eval {elapsed()}] error: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def run(cmd: list[str], what: str, capture: bool = False, hint: str = "") -> str:
    """Runs cmd with stderr (and stdout unless captured) passed through."""
    log("$ " + shlex.join(cmd))
    try:
        # Children's output goes to stderr so that stdout carries only the
        # report's path and summary (scriptable).
        p = subprocess.run(cmd, cwd=ROOT, text=True,
                           stdout=subprocess.PIPE if capture else sys.stderr)
    except FileNotFoundError as e:
        die(f"{what}: {e}")
    if p.returncode != 0:
        die(f"{what} failed (exit {p.returncode}){': ' + hint if hint else ''}")
    return p.stdout if capture else ""


# --------------------------------------------------------------------------
# Pure helpers (tested in tests/eval/test_report.py)


def expand_preset(name: str) -> dict:
    """The preset with per_family resolved for each of its families."""
    p = PRESETS[name]
    return {**p, "configs": list(p["configs"]),
            "per_family": per_family_counts(p["families"], p["per_family"], None)}


def per_family_counts(families: list[str], base: dict, overrides) -> dict:
    """family -> task count. overrides: ["N", "family=N", ...] from
    --per-family; a bare N replaces every family's count, family=N one."""
    counts = {f: base.get(f, base.get("*", 1)) for f in families}
    for o in overrides or []:
        fam, eq, n = o.rpartition("=")
        try:
            v = int(n)
        except ValueError:
            die(f"--per-family {o!r}: expected N or FAMILY=N")
        if v < 1:
            die(f"--per-family {o!r}: N must be at least 1")
        if not eq:
            counts = {f: v for f in counts}
        elif fam in counts:
            counts[fam] = v
        else:
            die(f"--per-family {o!r}: {fam!r} is not among the families {families}")
    return counts


def gen_groups(counts: dict) -> list[tuple[int, list[str]]]:
    """Families grouped by task count, since gen.py takes one --per-family."""
    groups: dict[int, list[str]] = {}
    for fam, n in counts.items():
        groups.setdefault(n, []).append(fam)
    return list(groups.items())


def split_list(values) -> list[str]:
    """--families a b / --families a,b / both. Commas inside braces belong to
    a policy's parameters (h2o{cold.format=int4,cold.fraction=0.5}@0.25/f16),
    as live.parse_config reads them."""
    out = []
    for v in values or []:
        depth, start = 0, 0
        for i, c in enumerate(v + ","):
            depth += (c == "{") - (c == "}")
            if c == "," and depth <= 0:
                if v[start:i]:
                    out.append(v[start:i])
                start = i + 1
    return out


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


# --------------------------------------------------------------------------
# Steps


def ensure_venv(plots: bool = True) -> str:
    """Python to run report.py with: the eval venv's, or this one (plots
    then skipped) where the venv cannot be made or plots is False."""
    if not plots:
        log("plots off (--no-plots): report.py runs without the venv")
        return sys.executable
    venv = os.environ.get("POLYKV_EVAL_VENV") or os.path.join(HOME_CACHE, "eval-venv")
    req = os.path.join(EVAL_DIR, "requirements.txt")
    py = os.path.join(venv, "bin", "python")
    stamp = os.path.join(venv, ".requirements.sha256")
    want = sha256_file(req)
    if os.path.exists(py) and os.path.exists(stamp) and open(stamp).read().strip() == want:
        log(f"venv {venv} is up to date")
        return py
    if not os.path.exists(py):
        log(f"creating venv {venv}")
        p = subprocess.run([sys.executable, "-m", "venv", venv], stdout=sys.stderr)
        if p.returncode != 0:
            log("warning: could not create the venv (Debian: apt-get install python3-venv); "
                "the report will have no plots")
            return sys.executable
    log(f"pip install -r {os.path.relpath(req, ROOT)} (numpy, matplotlib) into {venv}")
    p = subprocess.run([py, "-m", "pip", "install", "--disable-pip-version-check",
                        "--progress-bar", "off", "-r", req], stdout=sys.stderr)
    if p.returncode != 0:
        log("warning: pip install failed (is PyPI reachable?); the report will have no plots")
        return sys.executable
    with open(stamp, "w") as f:
        f.write(want + "\n")
    return py


# The evaluation's model: the first one worth measuring (docs: issue [qwen]).
DEFAULT_MODEL = "qwen2.5-coder-0.5b"
FETCHABLE_MODELS = ("smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")


def ensure_model(path: str | None) -> str:
    """--model is a path or a scripts/fetch-model.sh name (fetched if needed)."""
    name = DEFAULT_MODEL
    if path and path not in FETCHABLE_MODELS:
        if not os.path.isfile(path):
            die(f"model {path} not found (pass a path or one of {', '.join(FETCHABLE_MODELS)})")
        return os.path.abspath(path)
    if path:
        name = path
    out = run(["bash", "scripts/fetch-model.sh", name], f"fetching the model {name}", capture=True,
              hint=f"run bash scripts/fetch-model.sh {name} by hand to see why, or pass --model PATH")
    lines = [x for x in out.splitlines() if x.strip()]
    if not lines or not os.path.isfile(lines[-1].strip()):
        die("scripts/fetch-model.sh printed no model path; pass --model PATH")
    return lines[-1].strip()


def generate_tasks(tasks_dir: str, counts: dict, args, mn: int, mx: int) -> None:
    gen = os.path.join(EVAL_DIR, "workloads", "gen.py")
    if not os.path.exists(gen):
        die(f"{os.path.relpath(gen, ROOT)} is missing (the workload generator); "
            "or pass --workload FILE ...")
    groups = gen_groups(counts)
    for i, (n, fams) in enumerate(groups):
        # gen.py takes one --per-family, so families with different counts
        # are generated apart and their files merged into tasks_dir.
        dest = tasks_dir if len(groups) == 1 else os.path.join(tasks_dir, f".gen-{i}")
        run([sys.executable, gen, "--out", dest, "--seed", str(args.seed), "--split", args.split,
             "--families", GEN_FAMILIES_SEP.join(fams), "--per-family", str(n),
             "--min-tokens", str(mn), "--max-tokens", str(mx), "--data-dir", args.data_dir],
            f"gen.py ({', '.join(fams)})")
        if dest != tasks_dir:
            merge_into(dest, tasks_dir)


def merge_into(src: str, dst: str) -> None:
    for rel_root, _, files in os.walk(src):
        for f in files:
            s = os.path.join(rel_root, f)
            d = os.path.join(dst, os.path.relpath(s, src))
            os.makedirs(os.path.dirname(d), exist_ok=True)
            if not os.path.exists(d):
                os.replace(s, d)
            elif d.endswith(".json") and merge_json_lists(s, d):
                pass  # manifest.json: one list of tasks per call
            else:
                die(f"gen.py wrote {os.path.relpath(d, dst)} for two family groups; run with one "
                    "--per-family N for all families")
    shutil.rmtree(src)


def merge_json_lists(src: str, dst: str) -> bool:
    """Appends src's JSON list to dst's; False if either is not a list."""
    with open(src) as f:
        a = json.load(f)
    with open(dst) as f:
        b = json.load(f)
    if not isinstance(a, list) or not isinstance(b, list):
        return False
    with open(dst, "w") as f:
        json.dump(b + a, f, indent=1)
        f.write("\n")
    return True


def copy_workloads(files: list[str], tasks_dir: str) -> None:
    for i, f in enumerate(files):
        if not os.path.isfile(f):
            die(f"--workload {f}: no such file")
        name = os.path.basename(f)
        if os.path.exists(os.path.join(tasks_dir, name)):
            name = f"{i:03d}-{name}"
        shutil.copy(f, os.path.join(tasks_dir, name))


def task_counts(records: list[dict]) -> dict:
    fams: dict[str, set] = {}
    for r in records:
        fams.setdefault(r.get("family") or "?", set()).add(r.get("task"))
    return {k: len(v) for k, v in sorted(fams.items())}


def read_jsonl(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(x) for x in f if x.strip()]


def capacity_session_args(summary: dict) -> list[str]:
    """polykv-bench capacity --session values (NAME=TOKENS:KFMT:VFMT) for
    summary.json's capacity.live_inputs; entries it cannot express are left
    out."""
    out = []
    for e in (summary.get("capacity") or {}).get("live_inputs") or []:
        try:
            tokens = int(e["tokens"])
            name, k, v = str(e["name"]), e["k_format"], e["v_format"]
        except (KeyError, TypeError, ValueError):
            continue
        if tokens < 1 or k not in CAPACITY_FORMATS or v not in CAPACITY_FORMATS or not name:
            continue
        # The bench splits at the first '='; report.py's names avoid it, and
        # so must anything hand-edited into summary.json.
        out.append(f"{name.replace('=', '-')}={tokens}:{k}:{v}")
    return out


_ADMITTED = re.compile(r"capacity (.+): (\d+) sessions admitted$")


def measure_live_capacity(out: str, pool_mib: int, bench: str = BENCH,
                          timeout_s: float = CAPACITY_TIMEOUT_S) -> str | None:
    """Runs polykv-bench capacity for the strategies in out/summary.json and
    writes out/capacity_live.json (the daemon's log to capacity_live.log).
    Returns None on success, else a warning; a failure is written into
    capacity_live.json as {"error": ...} so that the report notes it."""
    dest = os.path.join(out, "capacity_live.json")
    try:
        with open(os.path.join(out, "summary.json")) as f:
            sessions = capacity_session_args(json.load(f))
    except (OSError, json.JSONDecodeError) as e:
        return f"summary.json is not readable ({e}); live capacity skipped"
    if not sessions:
        return "summary.json has no capacity.live_inputs; live capacity skipped"
    cmd = [bench, "capacity", "--json", "--pool-mib", str(pool_mib)]
    for s in sessions:
        cmd += ["--session", s]
    log("$ " + shlex.join(cmd))
    tmp = dest + ".tmp"
    last = ""
    try:
        with open(tmp, "w") as stdout, open(os.path.join(out, "capacity_live.log"), "w") as logf:
            # The in-process daemons log every session; only the per-strategy
            # totals are progress worth showing, the rest goes to the log file.
            with subprocess.Popen(cmd, cwd=ROOT, stdout=stdout, stderr=subprocess.PIPE,
                                  text=True) as p:
                killed = []
                timer = threading.Timer(timeout_s, lambda: (killed.append(1), p.kill()))
                timer.start()
                try:
                    for line in p.stderr:
                        logf.write(line)
                        line = line.strip()
                        if line:
                            last = line
                        m = _ADMITTED.search(line)
                        if m:
                            log(f"live capacity: {m.group(1)}: {m.group(2)} sessions admitted")
                    rc = p.wait()
                finally:
                    timer.cancel()
        error = None
        if rc != 0:
            error = (f"polykv-bench capacity exited {rc}"
                     + (f" (killed after {timeout_s:g} s)" if killed else "")
                     + (f": {last[:300]}" if last else ""))
        else:
            with open(tmp) as f:
                text = f.read()
            try:
                res = json.loads(text)
            except json.JSONDecodeError as e:
                res, error = None, f"polykv-bench capacity printed no JSON ({e})"
            if res is not None and not (isinstance(res, dict) and res.get("strategies")):
                error = "polykv-bench capacity printed JSON without strategies"
    except OSError as e:
        error = f"polykv-bench capacity could not run: {e}"
    if error is None:
        os.replace(tmp, dest)
        return None
    if os.path.exists(tmp):
        os.remove(tmp)
    with open(dest, "w") as f:
        json.dump({"bench": "capacity", "error": error, "pool_bytes": pool_mib << 20,
                   "sessions": sessions}, f, indent=1)
        f.write("\n")
    return error


def git_commit() -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, text=True,
                             capture_output=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=ROOT, text=True, capture_output=True).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


# --------------------------------------------------------------------------


def parse_args(argv):
    ap = argparse.ArgumentParser(
        description="Run the polykv agentic evaluation and write its report.",
        epilog="Presets are defined at the top of this file.")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="quick")
    ap.add_argument("--name", help="run name; output goes to OUT/NAME (default: the preset)")
    ap.add_argument("--out", default="results",
                    help="parent folder of runs, relative to the repository root (default results)")
    ap.add_argument("--families", nargs="+", help="families (space- or comma-separated)")
    ap.add_argument("--per-family", nargs="+", metavar="N|FAMILY=N",
                    help="tasks per family: N for all, FAMILY=N for one (default: the preset)")
    ap.add_argument("--configs", help='comma-separated configs, e.g. "full@1/f16,h2o@0.25/K8V4"')
    ap.add_argument("--workload", nargs="+", metavar="FILE",
                    help="task or plain worker-script files to run instead of generating tasks")
    ap.add_argument("--min-tokens", type=int, help="override the preset's context length range")
    ap.add_argument("--max-tokens", type=int)
    ap.add_argument("--model", help="GGUF model: a path or a scripts/fetch-model.sh name "
                    f"(default: {DEFAULT_MODEL})")
    ap.add_argument("--threads", type=int, default=2,
                    help="worker processes at once, each with --threads 1 (default 2)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--split", choices=("dev", "test"), default="dev",
                    help="gen.py's split: tune policies on dev (default), report headlines "
                    "from test only; they share no task")
    ap.add_argument("--data-dir", default=os.path.join(HOME_CACHE, "eval-data"),
                    help="public data sets for bfcl/humaneval (default ~/.cache/polykv/eval-data)")
    ap.add_argument("--skip-build", action="store_true", help="use the existing build/")
    ap.add_argument("--bin-dir", default=BIN_DIR,
                    help="where the binaries are (default build/bin; the build step still "
                    "builds build/)")
    ap.add_argument("--live", action="store_true",
                    help="accepted for commands written when an in-process harness was the "
                    "default: every run is live now")
    ap.add_argument("--resume", action="store_true",
                    help="keep OUT/NAME and its tasks, and skip the (task, config) pairs its "
                    "results.jsonl already holds")
    ap.add_argument("--no-teacher-force", action="store_true",
                    help="answer only: do not also run every config teacher-forced on the "
                    "reference's answer (kl_mean, top1_agreement; README: Teacher forcing)")
    ap.add_argument("--no-plots", action="store_true",
                    help="write the report without plots (no venv, no pip)")
    ap.add_argument("--no-live-capacity", action="store_true",
                    help="skip measuring capacity on a live polykvd (polykv-bench capacity)")
    ap.add_argument("--capacity-pool-mib", type=int, default=1024, metavar="MIB",
                    help="pool of the live capacity measurement (default 1024)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    # The commit the tasks and binaries come from: taken now, since a long run
    # may outlive later commits to the tree.
    commit = git_commit()
    preset = expand_preset(args.preset)
    families = split_list(args.families) or preset["families"]
    unknown = [f for f in families if f not in FAMILIES + LONG_FAMILIES]
    if unknown:
        log(f"warning: families {unknown} are not in {FAMILIES + LONG_FAMILIES}; passing them "
            "to gen.py anyway")
    base = PRESETS[args.preset]["per_family"]
    counts = per_family_counts(families, base, args.per_family)
    configs = split_list([args.configs]) if args.configs else preset["configs"]
    mn = args.min_tokens or preset["min_tokens"]
    mx = args.max_tokens or preset["max_tokens"]
    if mn > mx:
        die(f"--min-tokens {mn} > --max-tokens {mx}")
    if args.capacity_pool_mib < 1:
        die("--capacity-pool-mib must be at least 1")
    if args.threads < 1:
        die("--threads must be at least 1")
    bin_dir = os.path.abspath(os.path.expanduser(args.bin_dir))
    bench = os.path.join(bin_dir, "polykv-bench")
    name = args.name or args.preset
    # Relative to the repository root, where results/ is gitignored.
    out = os.path.join(ROOT, os.path.expanduser(args.out), name)
    tasks_dir = os.path.join(out, "tasks")
    need_data = not args.workload and bool(DATA_FAMILIES & set(families))
    live_capacity = not args.no_live_capacity
    _STEP[1] = 8 + need_data + live_capacity
    command = shlex.join(["python3", os.path.relpath(os.path.abspath(__file__), ROOT)]
                         + list(sys.argv[1:] if argv is None else argv))
    log(f"run {name!r}: {len(configs)} configs, families "
        + (", ".join(f"{f}×{n}" for f, n in counts.items()) if not args.workload
           else f"(workload files: {len(args.workload)})") + f", output {out}")

    step("report environment")
    report_py = ensure_venv(plots=not args.no_plots)

    if args.skip_build:
        step("build skipped (--skip-build)")
    else:
        step("build: bash scripts/build.sh")
        run(["bash", "scripts/build.sh"], "scripts/build.sh",
            hint="see the compiler output above")
    missing = live.Bins.at(bin_dir).missing()
    if missing:
        die(f"the run needs {', '.join(os.path.relpath(m, ROOT) for m in missing)}: build "
            "them with bash scripts/build.sh" + (" (or drop --skip-build)" if args.skip_build
                                                 else ""))

    step("model")
    model = ensure_model(args.model)
    log(f"model {model}")

    if need_data:
        step(f"data sets into {args.data_dir}")
        data_py = os.path.join(EVAL_DIR, "data.py")
        if not os.path.exists(data_py):
            die("bench/eval/data.py is missing; drop bfcl/humaneval from --families")
        run([sys.executable, data_py, "--dir", args.data_dir], "data.py")

    # A fresh output folder: stale tasks or records from an earlier run under
    # the same name would silently join this one's averages. --resume keeps
    # it, tasks included (the records name them).
    resumed = args.resume and os.path.isdir(tasks_dir) and bool(os.listdir(tasks_dir))
    if resumed:
        log(f"resuming the run in {out} with its tasks")
    elif os.path.exists(out):
        log(f"replacing the earlier run in {out}")
        shutil.rmtree(out)
    os.makedirs(tasks_dir, exist_ok=True)
    if resumed:
        step("tasks: kept (--resume)")
    elif args.workload:
        step(f"tasks: copying {len(args.workload)} workload file(s)")
        copy_workloads(args.workload, tasks_dir)
    else:
        step(f"tasks: gen.py, {args.split} split, seed {args.seed}, {mn}-{mx} tokens")
        generate_tasks(tasks_dir, counts, args, mn, mx)
    n_files = sum(len(f) for _, _, f in os.walk(tasks_dir))
    log(f"{n_files} task file(s) in {tasks_dir}")

    configs_txt = os.path.join(out, "configs.txt")
    with open(configs_txt, "w") as f:
        f.write("".join(c + "\n" for c in configs))
    results = os.path.join(out, "results.jsonl")
    step(f"run: live, {len(configs)} configs, {args.threads} workers at a time")
    for c in configs:
        try:
            live.parse_config(c)
        except ValueError as e:
            die(str(e))
    try:
        live_meta = live.run_live(tasks_dir, configs, model, out, bin_dir, args.threads,
                                  args.resume, log, teacher_force=not args.no_teacher_force)
    except live.LiveError as e:
        die(str(e))
    if not os.path.exists(results) or os.path.getsize(results) == 0:
        die(f"the live run wrote no records to {results}")

    step("score: score.py")
    scored = os.path.join(out, "scored.jsonl")
    score_py = os.path.join(EVAL_DIR, "score.py")
    if not os.path.exists(score_py):
        die("bench/eval/score.py is missing")
    run([sys.executable, score_py, results, "-o", scored], "score.py")

    step("meta.json")
    records = read_jsonl(scored)
    bpt = next((r["bytes_per_token_f16"] for r in records if r.get("bytes_per_token_f16")), None)
    bpt_source = "live records"
    if bpt is None:
        bpt, bpt_source = SMOLLM2_BYTES_PER_TOKEN_F16, (
            "constant for SmolLM2-135M (30 layers x K,V x 3 KV heads x 64 x 2 bytes)")
    meta = {
        "name": name,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": command,
        "model": model,
        "model_sha256": sha256_file(model),
        "git_commit": commit,
        "machine": {"cpus": os.cpu_count(), "cpu_model": cpu_model()},
        "matrix": configs,
        "task_counts": task_counts(records),
        "seed": args.seed,
        "split": None if args.workload else args.split,
        "wall_seconds": round(time.monotonic() - _T0, 1),
        "preset": args.preset,
        "per_family": None if args.workload else counts,
        "min_tokens": mn, "max_tokens": mx, "threads": args.threads,
        "workloads": args.workload or [],
        "bytes_per_token_f16": bpt,
        "bytes_per_token_f16_source": bpt_source,
        "max_context_tokens": MAX_CONTEXT_TOKENS,
        "static_session_bytes": MAX_CONTEXT_TOKENS * bpt,
        "mode": "live",
        "live": live_meta,
    }
    with open(os.path.join(out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")

    step("report: report.py")
    report_cmd = [report_py, os.path.join(EVAL_DIR, "report.py"), "--quiet", out]
    run(report_cmd, "report.py", capture=True)

    if live_capacity:
        if not os.access(bench, os.X_OK):
            step(f"live capacity skipped: {os.path.relpath(bench, ROOT)} is not built")
        else:
            # Sized from this run's summary.json, so it follows the first
            # report; the second one adds the measurement to report.md.
            step(f"live capacity: polykv-bench capacity, pool {args.capacity_pool_mib} MiB")
            warning = measure_live_capacity(out, args.capacity_pool_mib, bench=bench)
            if warning:
                log(f"warning: {warning}")
            # What negotiating with polykvd costs (report.py sets it against
            # the measured decode step).
            log("negotiation: polykv-bench rpc --json --iters 300")
            try:
                rpc = subprocess.run([bench, "rpc", "--json", "--iters", "300"], text=True,
                                     capture_output=True, timeout=300, check=True).stdout
                json.loads(rpc)
                with open(os.path.join(out, "rpc.json"), "w") as f:
                    f.write(rpc)
            except (OSError, ValueError, subprocess.SubprocessError) as e:
                log(f"warning: polykv-bench rpc failed ({e}); negotiation cost not reported")
            log("report.py again, with the live measurements")
            run(report_cmd, "report.py", capture=True)
    report_md = os.path.join(out, "report.md")
    summary = ""
    try:
        with open(os.path.join(out, "summary.json")) as f:
            summary = json.load(f).get("summary", "")
    except (OSError, json.JSONDecodeError):
        pass
    log(f"done: {len(records)} records")
    print(report_md)
    if summary:
        print("\n" + summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
