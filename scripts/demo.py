#!/usr/bin/env python3
"""The demo behind scripts/demo.sh: more agents in the same memory, answers kept.

Starts polykvd with a pool sized so that only a few of the agents'
uncompressed (f16) caches fit, then runs several times as many agents in it
at once: polykv-worker processes with a real model, in two tenants, each a
~2,000-token agent task (recall, tool traces, coding, two agents sharing a
system prompt) from bench/eval's seeded generator. They get the daemon's
built-in default QoS: nothing is configured. Beside them a second polykvd
runs the same agents with an exact f16 cache (its QoS set through the Admin
API with polykvctl), the reference for bytes and answers.

While they run it shows `polykvctl sessions`, `polykvctl status` and the
polykv_ metrics; at the end one line per agent: its peak pool bytes against
its f16 peak, and whether its answer is the uncompressed one's (and passes
the task's check); then how many such agents the same pool admits at f16
(polykv-bench capacity, the daemon's allocator in process) against the
default's, all admitted at once here.

Usage: scripts/demo.py --model GGUF [--bin-dir build/bin] [--pool-mib 64]
           [--per-family 2] [--metrics-port 9464] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench", "eval"))
sys.path.insert(1, os.path.join(ROOT, "bench", "eval", "workloads"))

import gen  # noqa: E402  (the evaluation's seeded task generator)
import live  # noqa: E402  (the evaluation's product-path runner: its worker flags)
import score  # noqa: E402  (each task's own check)

# Families that need no downloaded data; tenant of each.
FAMILIES = {"recall": "team-a", "tools": "team-a", "coding": "team-b", "multiagent": "team-b"}
SEED = 11
MIB = 1 << 20
RESERVE_RETRY_MS = 600_000  # an agent the full pool refuses waits this long (worker_cmd)


def log(msg: str) -> None:
    print(msg, flush=True)


def die(msg: str) -> None:
    print(f"demo: error: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


class Daemon:
    """A polykvd on a socket in `dir`; stop() sends SIGTERM (it drains)."""

    def __init__(self, bins: str, dir: str, name: str, pool_mib: int, metrics: str):
        self.socket = os.path.join(dir, f"{name}.sock")
        self.log_path = os.path.join(dir, f"{name}.log")
        # Arenas of 8 MiB, not 64: two tenants share a pool of a few of them,
        # and a tenant's arenas hold only its own pages (a pool this small
        # was stranded in one tenant's half-empty arenas; docs/security.md).
        self.cmd = [os.path.join(bins, "polykvd"), "--socket", self.socket,
                    "--pool-bytes", f"{pool_mib}MiB", "--arena-bytes", "8MiB",
                    "--metrics-address", metrics, "--lease-ms", str(live.LEASE_MS)]
        self.ctl = os.path.join(bins, "polykvctl")
        self.proc = None

    def start(self) -> None:
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT)
        t0 = time.monotonic()
        while not os.path.exists(self.socket):
            if self.proc.poll() is not None or time.monotonic() - t0 > 20:
                self.stop()
                with open(self.log_path) as f:
                    errors = [x for x in f.read().splitlines() if " error " in x] or ["no message"]
                msg = errors[-1].split("polykvd: ", 1)[-1]
                hint = (" (pass --metrics-port with a free port, or 'off')"
                        if "listen" in msg else "")
                die(f"polykvd did not start: {msg}{hint}\n  $ {shlex.join(self.cmd)}")
            time.sleep(0.05)

    def ctl_run(self, *args: str, check: bool = True) -> str:
        p = subprocess.run([self.ctl, "--socket", self.socket, *args], capture_output=True,
                           text=True)
        if check and p.returncode != 0:
            die(f"polykvctl {' '.join(args)}: {p.stderr.strip()}")
        return p.stdout

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def make_tasks(out: str, per_family: int) -> list[dict]:
    rc = gen.main(["--out", out, "--seed", str(SEED), "--split", "test",
                   "--families", ",".join(FAMILIES), "--per-family", str(per_family),
                   "--min-tokens", "1900", "--max-tokens", "2300"])
    if rc != 0:
        die(f"gen.py failed ({rc})")
    with open(os.path.join(out, "manifest.json")) as f:
        return json.load(f)


def worker_cmd(bins: str, model: str, daemon: Daemon, task: str, tenant: str, agent: str):
    # The evaluation's live flags (bench/eval/live.py run_worker): the formats
    # and page size are the agent's QoS, not the worker's choice. An agent the
    # full pool refuses waits for the others to compact or finish; on a busy
    # machine they take longer than the worker's default 30 s, so the demo
    # waits up to RESERVE_RETRY_MS rather than fail an agent that would fit.
    return [os.path.join(bins, "polykv-worker"), "run", task, "--daemon", daemon.socket,
            "--tenant", tenant, "--agent", agent, "--block-tokens", "0",
            "--threads", "1", "--max-new-tokens", str(live.DEFAULT_MAX_NEW_TOKENS),
            "--prefill-chunk", str(live.PREFILL_CHUNK), "--model", model, "--summary",
            "--reserve-retry-ms", str(RESERVE_RETRY_MS)]


def mib(b: int) -> str:
    return f"{b / MIB:.1f} MiB"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--model", required=True, help="GGUF path (scripts/fetch-model.sh prints it)")
    ap.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--pool-mib", type=int, default=64,
                    help="the shared pool (default 64: two or three ~2,000-token f16 caches "
                         "of Qwen2.5-Coder-0.5B)")
    ap.add_argument("--per-family", type=int, default=2,
                    help="agents per family, four families (default 2: 8 agents)")
    ap.add_argument("--metrics-port", default="9464",
                    help="the shared pool's /metrics port on 127.0.0.1, or 'off' (default 9464)")
    ap.add_argument("--dir", help="run folder (default: a fresh temp dir)")
    args = ap.parse_args(argv)
    if not os.path.exists(args.model):
        die(f"no model at {args.model}: run scripts/fetch-model.sh qwen2.5-coder-0.5b")
    for b in ("polykvd", "polykvctl", "polykv-worker", "polykv-bench"):
        if not os.access(os.path.join(args.bin_dir, b), os.X_OK):
            die(f"{b} is not built in {args.bin_dir}: run scripts/build.sh")
    metrics = "off" if args.metrics_port == "off" else f"127.0.0.1:{args.metrics_port}"
    dir = args.dir or tempfile.mkdtemp(prefix="polykv-demo.")
    os.makedirs(dir, exist_ok=True)
    t_start = time.monotonic()

    tasks = make_tasks(os.path.join(dir, "tasks"), args.per_family)
    shared = Daemon(args.bin_dir, dir, "polykvd", args.pool_mib, metrics)
    ref = Daemon(args.bin_dir, dir, "reference", 1024, "off")
    shared.start()
    try:
        ref.start()
    except SystemExit:
        shared.stop()
        raise
    procs = []
    try:
        log(f"== polykvd with a {args.pool_mib} MiB pool (socket {shared.socket}, metrics "
            f"{metrics}, log {shared.log_path})")
        log(f"== {len(tasks)} agents in 2 tenants at once, the built-in default QoS (nothing set);")
        log(f"   beside them the same agents with an exact f16 cache on a second polykvd")
        for e in tasks:
            # The reference's QoS through the Admin API: whole cache, f16 pages.
            ref.ctl_run("qos", "set", e["task_id"], "--policy", "full", "--key-format", "f16",
                        "--value-format", "f16")
        log("   default QoS: " + " ".join(shared.ctl_run("qos", "get", "any-agent").split()))
        for e in tasks:
            task = os.path.join(dir, "tasks", e["file"])
            tenant = FAMILIES[e["family"]]
            for d, kind in ((shared, "default"), (ref, "f16")):
                base = os.path.join(dir, f"{e['task_id']}.{kind}")
                cmd = worker_cmd(args.bin_dir, args.model, d, task, tenant, e["task_id"])
                with open(base + ".jsonl", "w") as so, open(base + ".err", "w") as se:
                    procs.append((e, kind, base, subprocess.Popen(cmd, stdout=so, stderr=se)))
        # A look at the shared pool once every session is open and has been
        # compacted at least once (past its budget: ~1,100 of ~2,000 tokens).
        for _ in range(1200):
            try:
                sessions = json.loads(shared.ctl_run("sessions", "--json", check=False) or "{}")
            except json.JSONDecodeError:
                sessions = {}
            sessions = sessions.get("sessions", [])
            if len(sessions) >= len(tasks) and all(int(s.get("epoch", 0)) > 0 for s in sessions):
                break
            if any(p.poll() is not None for _, kind, _, p in procs if kind == "default"):
                break
            time.sleep(0.5)
        log("")
        log(shared.ctl_run("sessions", check=False).rstrip())
        log("")
        log(shared.ctl_run("status", check=False).rstrip())
        if metrics != "off":
            log("\n== metrics (polykv_ state families)")
            try:
                import urllib.request
                text = urllib.request.urlopen(f"http://{metrics}/metrics", timeout=5).read().decode()
                for line in text.splitlines():
                    if re.match(r"polykv_(pool_bytes|sessions|agent_bytes|compactions_total)", line):
                        log(line)
            except OSError as err:
                log(f"(metrics scrape failed: {err})")
        failed = []
        for e, kind, base, p in procs:
            if p.wait() != 0:
                failed.append(f"{e['task_id']} ({kind}, exit {p.returncode}): "
                              + live.tool_error("polykv-worker", open(base + ".err").read()))
        if failed:
            die("worker(s) failed:\n  " + "\n  ".join(failed))
    finally:
        for *_, p in procs:
            if p.poll() is None:
                p.kill()
        shared.stop()
        ref.stop()
    return report(args, dir, tasks, time.monotonic() - t_start)


def read_run(base: str) -> tuple[str, dict]:
    with open(base + ".jsonl") as f:
        turns, summary = live.parse_worker_output(f.read())
    if not turns or summary is None:
        die(f"{base}.jsonl: no answer or summary")
    return turns[-1]["text"], summary


def capacity(args, tokens: int) -> int:
    """Sessions of `tokens` f16 tokens the same pool admits (the daemon's
    allocator, in process): page and superblock rounding included."""
    cmd = [os.path.join(args.bin_dir, "polykv-bench"), "capacity", "--json",
           "--pool-mib", str(args.pool_mib), "--session", f"f16={tokens}:f16:f16",
           "--layers", str(args.layers), "--kv-heads", str(args.kv_heads),
           "--head-dim", str(args.head_dim)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        die(f"{shlex.join(cmd)}: {p.stderr.strip()[-300:]}")
    found = re.search(r'"admitted"\s*:\s*(\d+)', p.stdout)
    if not found:
        die(f"polykv-bench capacity printed no admitted count: {p.stdout[:300]}")
    return int(found.group(1))


def report(args, dir: str, tasks: list[dict], seconds: float) -> int:
    log("\n== per agent: peak pool bytes against the same agent's f16 cache, answer against it")
    log(f"{'AGENT':<20} {'TENANT':<7} {'CONTEXT':>7} {'F16 PEAK':>10} {'PEAK':>9} "
        f"{'OF F16':>6}  {'ANSWER':<10} CHECK f16/default")
    same = kept = solved = 0
    total_default = 0
    contexts = []
    for e in tasks:
        with open(os.path.join(dir, "tasks", e["file"])) as f:
            ev = json.loads(f.read().splitlines()[-1])["eval"]
        text_d, sum_d = read_run(os.path.join(dir, f"{e['task_id']}.default"))
        text_f, sum_f = read_run(os.path.join(dir, f"{e['task_id']}.f16"))
        ok_d = score.score(ev, text_d)["success"]
        ok_f = score.score(ev, text_f)["success"]
        same += text_d == text_f
        solved += ok_f
        kept += ok_f and ok_d
        context = sum_f["prompt_tokens"] + sum_f["completion_tokens"]
        contexts.append(context)
        total_default += sum_d["kv_bytes_peak"]
        ratio = sum_d["kv_bytes_peak"] / sum_f["kv_bytes_peak"]
        log(f"{e['task_id']:<20} {FAMILIES[e['family']]:<7} {context:>7} "
            f"{mib(sum_f['kv_bytes_peak']):>10} {mib(sum_d['kv_bytes_peak']):>9} {ratio:>6.3f}  "
            f"{'same' if text_d == text_f else 'differs':<10} "
            f"{'pass' if ok_f else 'fail'}/{'pass' if ok_d else 'fail'}")
    n = len(tasks)
    args.layers, args.kv_heads, args.head_dim = model_geometry(args, dir, tasks[0])
    longest = max(contexts)
    at_f16 = capacity(args, longest)
    log(f"\nanswers: {same} of {n} identical to the f16 cache's; the task check passes for "
        f"{kept} of the {solved} the f16 cache passes")
    log(f"bytes: the {n} default sessions peaked at {mib(total_default)} together "
        f"(each at its own peak), in a {args.pool_mib} MiB pool")
    log(f"admitted in the same {args.pool_mib} MiB pool: f16 {at_f16} sessions of "
        f"{longest} tokens (polykv-bench capacity); the default {n} of {n}, all at once "
        f"(above)")
    log(f"demo: {seconds:.0f} s, run folder {dir}")
    return 0


def model_geometry(args, dir: str, e: dict) -> tuple[int, int, int]:
    """(layers, kv heads, head dim) as polykv-worker --count-tokens prints them."""
    task = os.path.join(dir, "tasks", e["file"])
    p = subprocess.run([os.path.join(args.bin_dir, "polykv-worker"), "run", task,
                        "--count-tokens", "--model", args.model], capture_output=True, text=True)
    for line in p.stdout.splitlines():
        try:
            o = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "num_layers" in o:
            return o["num_layers"], o["num_kv_heads"], o["head_dim"]
    die(f"polykv-worker --count-tokens printed no model geometry: {p.stderr.strip()[-300:]}")


if __name__ == "__main__":
    sys.exit(main())
