#!/usr/bin/env python3
"""Concurrent agents on one live polykvd: peak pool bytes with and without
shared prefixes (issue 42, scope 4a), on the product path.

One group of `multiagent` tasks (bench/eval/workloads/multiagent.py: 16 agents
whose first message is the same ~1500-token system prompt) runs as 16
`polykv-worker run TASK --daemon S` processes on one polykvd, one thread each,
in three modes, each on a fresh daemon:

  reference    every agent's QoS set through the Admin API to the full cache
               in f16 pages (`polykvctl qos set A --policy full --key-format
               f16 --value-format f16`): the answers the others are scored
               against (relative success) and the paged-f16 baseline's tokens
  independent  the shipped default QoS (none set), no sharing
  shared       the shipped default QoS, every worker with --share-prefix-messages 1
               (the system prompt's pages shared, attached by the others)

In every mode agent 0 starts first and the other agents start together once
it has committed the shared system prompt (so that in `shared` it has been
shared: the store shares its full pages at each commit); all 16 sessions
are then live at once. polykvctl status --json
is sampled every 0.25 s for the pool's used bytes, less cached prefix blocks
(held by no session: free for admission, dropped when memory is needed): the
peak is what the mode needed (the peak with them is reported too). Baselines from the reference run's token counts: static f16 (each
agent a --static-tokens f16 cache, 8192 by default, allocated up front) and
paged f16 (each agent its own tokens, rounded up to 16-token pages).

Agents that wait (issue 42, scope 4b): in the `paced` modes every agent
waits --pause-ms before each tool message, as for its tool (the worker
prefills what it holds and says Idle: `polykv-worker run
--pause-before-tools-ms`), the shipped default QoS, no sharing; all agents
start together, or agent i --stagger-s * i seconds after agent 0:

  paced          a pool that holds them all (--pool-mib): the answers the
                 other two are compared with, token for token
  paced-small    a pool of --small-pool-mib, without offload tiers
  paced-offload  the same small pool, with a host offload tier and the idle
                 timer (--offload-host-bytes 1GiB --offload-idle-ms 200):
                 waiting agents' pages leave the pool and come back

Attach speed: in `shared`, the attaching agents' attach_ms (the worker's turn
JSON) against what prefilling those tokens cost agent 0 alone in the same run
(its time to commit the shared prompt, probes included: the product path).
--system-pad-tokens N lengthens every agent's system prompt by about N tokens
of this repository's source (the same text for all), for a longer shared
prefix.

Writes OUT/<mode>.json per mode (--resume skips modes already written) and
OUT/summary.json; prints the summary. Stdlib only (with bench/eval's live.py
and score.py).

  python3 bench/eval/agents_capacity.py --out results/agents [--agents 16]
      [--model qwen2.5-coder-0.5b] [--modes reference,independent,shared]
      [--pool-mib 2048] [--bin-dir build/bin] [--resume]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.join(HERE, "workloads"))

import live  # noqa: E402
import offload_restore  # noqa: E402
import score  # noqa: E402

MODES = ("reference", "independent", "shared", "paced", "paced-small", "paced-offload")
PACED = ("paced", "paced-small", "paced-offload")
PAGE = 16  # the paged-f16 baseline's page


def log(msg: str) -> None:
    print(f"[agents-capacity {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def generate(tasks_dir: str, agents: int, seed: int) -> list[str]:
    subprocess.run([sys.executable, os.path.join(HERE, "workloads", "gen.py"), "--out", tasks_dir,
                    "--families", "multiagent", "--per-family", str(agents), "--split", "test",
                    "--seed", str(seed)], check=True, stdout=subprocess.DEVNULL)
    return live.list_tasks(tasks_dir)


def pad_system_prompts(tasks: list[str], tokens: int) -> None:
    """Appends about `tokens` tokens of source text to each task's first
    (system) message, the same text for every task."""
    pad = "\n\n# Repository source, for reference\n" + offload_restore.source_text(tokens)
    for path in tasks:
        with open(path) as f:
            lines = [json.loads(line) for line in f if line.strip()]
        if lines[0].get("role") != "system" or pad in lines[0]["content"]:
            continue
        lines[0]["content"] += pad
        with open(path, "w") as f:
            f.writelines(json.dumps(line) + "\n" for line in lines)


def ctl_json(bins: live.Bins, socket: str, *args: str) -> dict:
    p = subprocess.run([bins.ctl, "--socket", socket, "--json", *args], capture_output=True,
                       text=True)
    return json.loads(p.stdout) if p.returncode == 0 and p.stdout.strip() else {}


class Sampler:
    """polykvctl status --json every `every` s: the peaks of the pool's used
    bytes, of those less cached prefix blocks (held by no session: free for
    admission, dropped when memory is needed), and of the prefix blocks."""

    def __init__(self, bins: live.Bins, socket: str, every: float = 0.25):
        self.bins, self.socket, self.every = bins, socket, every
        self.peak_used = self.peak_held = self.peak_sessions = self.peak_prefix = 0
        self.peak_offloaded = self.peak_offloaded_sessions = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            s = ctl_json(self.bins, self.socket, "status")
            pool, prefix = s.get("pool", {}), s.get("prefix", {})
            used, cached = int(pool.get("used_bytes", 0)), int(prefix.get("cached_bytes", 0))
            self.peak_used = max(self.peak_used, used)
            self.peak_held = max(self.peak_held, used - cached)
            self.peak_sessions = max(self.peak_sessions, len(s.get("sessions", [])))
            self.peak_prefix = max(self.peak_prefix, int(prefix.get("shared_bytes", 0)) + cached)
            offload = s.get("offload", {})
            self.peak_offloaded = max(self.peak_offloaded, int(offload.get("bytes", 0)))
            self.peak_offloaded_sessions = max(self.peak_offloaded_sessions,
                                               int(offload.get("session_count", 0)))
            self._stop.wait(self.every)

    def __enter__(self) -> "Sampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def committed_of(bins: live.Bins, socket: str, agent: str) -> int:
    for s in ctl_json(bins, socket, "sessions").get("sessions", []):
        if s.get("agent_id") == agent:
            return int(s.get("committed_tokens", 0))
    return -1


def run_mode(mode: str, tasks: list[str], bins: live.Bins, model: str, pool_mib: int,
             out_dir: str, prompt_tokens: int, pause_ms: int = 0, small_pool_mib: int = 0,
             reserve_retry_ms: int | None = None, stagger_s: float = 0) -> dict:
    extra = ("--offload-host-bytes", "1GiB", "--offload-idle-ms", "200") \
        if mode == "paced-offload" else ()
    if mode in ("paced-small", "paced-offload"):
        pool_mib = small_pool_mib
    daemon = live.Daemon(bins.polykvd, pool_mib << 20, os.path.join(out_dir, f"{mode}.polykvd.log"),
                         extra)
    daemon.start()
    procs = []
    try:
        agents = [f"a{i:02d}" for i in range(len(tasks))]
        if mode == "reference":
            for a in agents:
                subprocess.run([bins.ctl, "--socket", daemon.socket, "qos", "set", a, "--policy",
                                "full", "--key-format", "f16", "--value-format", "f16",
                                "--block-tokens", "0", "--budget-tokens", "0",
                                "--budget-fraction", "0"], check=True, capture_output=True)

        def start(i: int) -> None:
            cmd = [bins.worker, "run", tasks[i], "--daemon", daemon.socket, "--agent", agents[i],
                   "--tenant", "agents", "--block-tokens", "0", "--threads", "1",
                   "--model", model, "--summary"]
            if mode == "shared":
                cmd += ["--share-prefix-messages", "1"]
            if mode in PACED:
                cmd += ["--pause-before-tools-ms", str(pause_ms)]
            if reserve_retry_ms is not None:
                cmd += ["--reserve-retry-ms", str(reserve_retry_ms)]
            base = os.path.join(out_dir, f"{mode}.{agents[i]}")
            procs.append((i, subprocess.Popen(cmd, stdout=open(base + ".jsonl", "w"),
                                              stderr=open(base + ".err", "w")), base))

        t0 = time.monotonic()
        with Sampler(bins, daemon.socket) as sampler:
            start(0)
            # The others start once agent 0 holds the shared system prompt
            # (paced agents share nothing: together, or staggered).
            while mode not in PACED and committed_of(bins, daemon.socket, agents[0]) < prompt_tokens:
                if procs[0][1].poll() is not None:
                    break
                time.sleep(0.2)
            prompt_seconds = time.monotonic() - t0
            if mode not in PACED:
                log(f"{mode}: agent 0 committed the system prompt after {prompt_seconds:.0f} s; "
                    f"starting {len(tasks) - 1} more")
            for i in range(1, len(tasks)):
                if stagger_s:  # agent i starts i * stagger_s after agent 0
                    time.sleep(max(0.0, t0 + i * stagger_s - time.monotonic()))
                start(i)
            for _, p, _ in procs:
                p.wait()
        seconds = time.monotonic() - t0
        records = []
        for i, p, base in sorted(procs):
            with open(base + ".jsonl") as f:
                turns, summary = live.parse_worker_output(f.read())
            task = live.read_task(tasks[i])
            turn = turns[-1] if turns else {}
            text = turn.get("text", "")
            graded = score.score(task.eval or {}, text) if turns else {"success": False}
            records.append({
                "agent": agents[i], "task": task.id, "rc": p.returncode,
                "success": bool(graded.get("success")), "text": text,
                "prompt_tokens": sum(t.get("prompt_tokens", 0) for t in turns),
                "attached_tokens": sum(t.get("attached_tokens", 0) for t in turns),
                "attach_ms": sum(t.get("attach_ms", 0) for t in turns),
                "prefill_ms": sum(t.get("prefill_ms", 0) for t in turns),
                "cached_tokens": turn.get("cached_tokens"),
                "kv_bytes_peak": turn.get("kv_bytes_peak"),
                "tokens": (summary or {}).get("prompt_tokens", 0) +
                          (summary or {}).get("completion_tokens", 0),
            })
        failed = [r for r in records if r["rc"] != 0]
        if failed:
            log(f"{mode}: {len(failed)} workers failed, e.g. {failed[0]['agent']}: see "
                f"{os.path.join(out_dir, mode + '.' + failed[0]['agent'] + '.err')}")
        return {"mode": mode, "agents": len(tasks), "seconds": round(seconds, 1),
                "peak_used_bytes": sampler.peak_used, "peak_held_bytes": sampler.peak_held,
                "peak_sessions": sampler.peak_sessions,
                "peak_prefix_bytes": sampler.peak_prefix,
                "peak_offloaded_bytes": sampler.peak_offloaded,
                "peak_offloaded_sessions": sampler.peak_offloaded_sessions,
                "pool_bytes": pool_mib << 20, "pause_ms": pause_ms, "stagger_s": stagger_s,
                "reserve_retry_ms": reserve_retry_ms,
                # Agent 0, alone, prefilling and committing the shared prompt.
                "prompt_seconds": round(prompt_seconds, 2), "prompt_tokens": prompt_tokens,
                "sessions_served": len(records) - len(failed), "records": records}
    finally:
        for _, p, _ in procs:
            if p.poll() is None:
                p.kill()
        daemon.stop()


def summarize(results: dict, geometry: dict, static_tokens: int) -> dict:
    bpt = live.bytes_per_token_f16(geometry)
    ref = results.get("reference")
    out = {"f16_bytes_per_token": bpt, "modes": {}}
    if ref:
        tokens = [r["tokens"] for r in ref["records"]]
        out["static_f16_bytes"] = len(tokens) * static_tokens * bpt
        out["paged_f16_bytes"] = sum(math.ceil(t / PAGE) * PAGE for t in tokens) * bpt
        ref_ok = {r["agent"]: r["success"] for r in ref["records"]}
    for mode, res in results.items():
        m = {"peak_used_bytes": res["peak_used_bytes"], "peak_held_bytes": res["peak_held_bytes"],
             "peak_prefix_bytes": res["peak_prefix_bytes"], "seconds": res["seconds"],
             "sessions_served": res["sessions_served"], "peak_sessions": res["peak_sessions"],
             "success": sum(r["success"] for r in res["records"]),
             "pool_bytes": res.get("pool_bytes"),
             "peak_offloaded_bytes": res.get("peak_offloaded_bytes", 0),
             "peak_offloaded_sessions": res.get("peak_offloaded_sessions", 0)}
        paced = results.get("paced")
        if mode in PACED and paced and mode != "paced":
            # Token for token against the same agents in a pool that holds them all.
            want = {r["agent"]: r["text"] for r in paced["records"] if r["rc"] == 0}
            m["texts_equal_to_paced"] = sum(
                1 for r in res["records"] if r["rc"] == 0 and want.get(r["agent"]) == r["text"])
        if ref:
            solved = [a for a, ok in ref_ok.items() if ok]
            kept = sum(1 for r in res["records"] if r["agent"] in solved and r["success"])
            m["relative_success"] = round(kept / len(solved), 4) if solved else None
            if res["peak_held_bytes"]:
                m["x_static_f16"] = round(out["static_f16_bytes"] / res["peak_held_bytes"], 2)
                m["x_paged_f16"] = round(out["paged_f16_bytes"] / res["peak_held_bytes"], 2)
                # The reference run is paged f16, measured live at the same
                # concurrency (agents end at different times: below the sum).
                m["x_reference_peak"] = round(ref["peak_held_bytes"] / res["peak_held_bytes"], 2)
        attached = [r for r in res["records"] if r["attached_tokens"] > 0]
        if attached:
            first = res["records"][0]
            per_token_ms = first["prefill_ms"] / max(1, first["prompt_tokens"])
            speedups = sorted(per_token_ms * r["attached_tokens"] / max(r["attach_ms"], 1e-3)
                              for r in attached)
            m["attached_agents"] = len(attached)
            m["attached_tokens_mean"] = round(sum(r["attached_tokens"] for r in attached) /
                                              len(attached), 1)
            m["attach_ms_mean"] = round(sum(r["attach_ms"] for r in attached) / len(attached), 3)
            # Agent 0's whole-run prefill per token: inflated by the other agents
            # sharing the cores. Agent 0 alone on the prompt is the number to quote.
            m["attach_vs_prefill_median"] = round(speedups[len(speedups) // 2], 1)
            if res.get("prompt_seconds"):
                alone_ms = 1e3 * res["prompt_seconds"] / res["prompt_tokens"]
                m["attach_vs_prompt_prefill_alone"] = round(
                    alone_ms * m["attached_tokens_mean"] / max(m["attach_ms_mean"], 1e-3), 1)
        out["modes"][mode] = m
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output directory (created if missing)")
    ap.add_argument("--agents", type=int, default=16, help="agents of the group (default 16)")
    ap.add_argument("--model", default="qwen2.5-coder-0.5b",
                    help="scripts/fetch-model.sh name or GGUF path (default qwen2.5-coder-0.5b)")
    ap.add_argument("--modes", default=",".join(MODES), help=f"some of {','.join(MODES)}")
    ap.add_argument("--pool-mib", type=int, default=2048, help="polykvd --pool-bytes (MiB)")
    ap.add_argument("--pause-ms", type=int, default=20000,
                    help="paced modes: each agent's wait before each tool message (default 20000)")
    ap.add_argument("--small-pool-mib", type=int, default=48,
                    help="paced-small and paced-offload: polykvd --pool-bytes (MiB, default 48)")
    ap.add_argument("--reserve-retry-ms", type=int, default=None,
                    help="workers' --reserve-retry-ms: how long one waits for room (default: "
                         "the worker's, 30000)")
    ap.add_argument("--stagger-s", type=float, default=0,
                    help="paced modes: agent i starts i * S seconds after agent 0 (default 0: "
                         "together)")
    ap.add_argument("--static-tokens", type=int, default=8192,
                    help="tokens of the static f16 baseline's cache per agent (default 8192)")
    ap.add_argument("--seed", type=int, default=1, help="gen.py seed (default 1)")
    ap.add_argument("--system-pad-tokens", type=int, default=0,
                    help="lengthen every system prompt by about this many tokens (default 0)")
    ap.add_argument("--bin-dir", default=os.path.join(HERE, "..", "..", "build", "bin"))
    ap.add_argument("--resume", action="store_true", help="keep modes already in --out")
    args = ap.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    if not modes or any(m not in MODES for m in modes):
        ap.error(f"--modes: some of {','.join(MODES)}")
    bins = live.Bins.at(args.bin_dir)
    if bins.missing():
        ap.error(f"missing binaries: {', '.join(bins.missing())} (build: scripts/build.sh)")
    os.makedirs(args.out, exist_ok=True)
    tasks_dir = os.path.join(args.out, "tasks")
    tasks = generate(tasks_dir, args.agents, args.seed)[: args.agents]
    if args.system_pad_tokens > 0:
        pad_system_prompts(tasks, args.system_pad_tokens)
    count = live.count_tokens(bins, args.model, tasks[0])
    geometry = count[0]
    # The shared system prompt: the position of the second message.
    prompt_tokens = [c["position"] for c in count[1:] if "position" in c][1]
    log(f"{len(tasks)} agents, system prompt {prompt_tokens} tokens, model {args.model}")
    results = {}
    for mode in modes:
        path = os.path.join(args.out, f"{mode}.json")
        if args.resume and os.path.exists(path):
            with open(path) as f:
                results[mode] = json.load(f)
            log(f"{mode}: kept from {path}")
            continue
        log(f"{mode}: running")
        res = results[mode] = run_mode(mode, tasks, bins, args.model, args.pool_mib, args.out,
                                       prompt_tokens, args.pause_ms, args.small_pool_mib,
                                       args.reserve_retry_ms,
                                       args.stagger_s if mode in PACED else 0)
        with tempfile.NamedTemporaryFile("w", dir=args.out, delete=False) as f:
            json.dump(res, f, indent=1)
        os.replace(f.name, path)
        log(f"{mode}: peak {res['peak_used_bytes'] / 2**20:.1f} MiB, "
            f"{sum(r['success'] for r in res['records'])}/{len(tasks)} answers right, "
            f"{res['seconds']:.0f} s")
    summary = summarize(results, geometry, args.static_tokens)
    summary["command"] = " ".join(["python3", "bench/eval/agents_capacity.py", *sys.argv[1:]])
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
