#!/usr/bin/env python3
"""Restoring an offloaded session against recomputing its prefill (issue 42,
scope 4b), on the product path: the reference worker on a live polykvd with
the shipped default QoS (none set), Qwen2.5-Coder-0.5B by default.

Per tier (host memory, disk), on a fresh daemon with only that tier:

  1. `polykv-worker chat --daemon S` gets one ~4K-token message (source files
     of this repository, joined into one line) and answers one token: the
     time from sending it to the turn's end is the prefill the worker would
     have to redo to rebuild the session (probes included: what the shipped
     default runs);
  2. a one-word message, answered in one token, with the session in the
     pool: the turn's time without a restore;
  3. `polykvctl offload ID` (the worker is idle between messages), then the
     daemon's page cache dropped where the kernel lets us (disk tier: the
     read then comes from the device), then another one-word message: the
     turn's time with the restore, and the daemon's own restore time
     (polykv_restore_seconds_sum).

Writes OUT/<tier>.json (--resume skips tiers already written) and
OUT/summary.json; prints the summary. Stdlib only (with bench/eval's live.py).

  python3 bench/eval/offload_restore.py --out docs/results/DATE-offload
      [--tokens 4096] [--model qwen2.5-coder-0.5b] [--tiers host,disk]
      [--threads 2] [--bin-dir build/bin] [--resume]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import live  # noqa: E402

CHARS_PER_TOKEN = 3.3  # this repository's C++ for the Qwen tokenizer, near enough


def log(msg: str) -> None:
    print(f"[offload-restore {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def source_text(tokens: int) -> str:
    """Source text of this repository, about `tokens` tokens, on one line."""
    want = int(tokens * CHARS_PER_TOKEN)
    parts = []
    for path in sorted(glob.glob(os.path.join(ROOT, "daemon", "pool", "*.cc"))):
        with open(path) as f:
            parts.append(" ".join(f.read().split()))
        if sum(map(len, parts)) >= want:
            break
    return " ".join(parts)[:want]


def long_message(tokens: int) -> str:
    """A message of about `tokens` tokens, on one line (chat reads lines)."""
    return "Summarize this code in one word: " + source_text(tokens)


class Chat:
    def __init__(self, bins: live.Bins, socket: str, model: str, threads: int):
        self.proc = subprocess.Popen(
            [bins.worker, "chat", "--daemon", socket, "--model", model, "--max-new-tokens", "1",
             "--threads", str(threads)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def say(self, message: str) -> tuple[float, str]:
        """Seconds from sending `message` to the turn's statistics line; the line."""
        t0 = time.monotonic()
        self.proc.stdin.write(message + "\n")
        self.proc.stdin.flush()
        while True:
            line = self.proc.stderr.readline()
            if not line:
                raise live.LiveError(f"worker ended ({self.proc.wait()})")
            if "generated tokens" in line:
                return time.monotonic() - t0, line.strip().lstrip("> ")

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=120)


def drop_page_cache() -> bool:
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
        return True
    except OSError:
        return False


def restore_seconds(daemon: live.Daemon) -> float:
    values = live.metric_values(daemon.scrape(("polykv_restore_seconds_sum",)))
    return values.get("polykv_restore_seconds_sum", 0.0)


def run_tier(tier: str, bins: live.Bins, model: str, tokens: int, threads: int,
             out_dir: str) -> dict:
    offload_dir = os.path.join(out_dir, f"{tier}.offload")
    extra = (["--offload-host-bytes", "1GiB"] if tier == "host" else
             ["--offload-dir", offload_dir, "--offload-disk-bytes", "4GiB"])
    daemon = live.Daemon(bins.polykvd, 1 << 30, os.path.join(out_dir, f"{tier}.polykvd.log"),
                         tuple(extra))
    daemon.start()
    try:
        chat = Chat(bins, daemon.socket, model, threads)
        log(f"{tier}: prefill of ~{tokens} tokens")
        prefill_s, prefill_line = chat.say(long_message(tokens))
        warm_s, _ = chat.say("Thanks.")
        sessions = json.loads(subprocess.run([bins.ctl, "--socket", daemon.socket, "sessions",
                                              "--json"], check=True, capture_output=True,
                                             text=True).stdout)["sessions"]
        sid = sessions[0]["session_id"]
        committed = int(sessions[0]["committed_tokens"])
        off = json.loads(subprocess.run([bins.ctl, "--socket", daemon.socket, "offload", str(sid),
                                         "--json"], check=True, capture_output=True,
                                        text=True).stdout)
        dropped = drop_page_cache() if tier == "disk" else False
        before = restore_seconds(daemon)
        restored_s, _ = chat.say("Thanks.")
        server_s = restore_seconds(daemon) - before
        chat.close()
        out = {"tier": tier, "model": model, "prompt": prefill_line,
               "committed_tokens": committed, "offloaded_bytes": int(off["bytes"]),
               "stored_in": off["tier"], "page_cache_dropped": dropped,
               "prefill_s": round(prefill_s, 3), "turn_in_pool_s": round(warm_s, 3),
               "turn_after_offload_s": round(restored_s, 3),
               "restore_server_s": round(server_s, 4),
               "prefill_over_restore": round(prefill_s / max(server_s, 1e-6), 1),
               # The whole turn that brought the session back (restore,
               # prefill of the new message, one token) against the
               # prefill it spared: a lower bound on the gain.
               "prefill_over_turn_after_offload": round(prefill_s / restored_s, 1)}
        log(f"{tier}: {out}")
        return out
    finally:
        daemon.stop()
        shutil.rmtree(offload_dir, ignore_errors=True)  # its entries die with the daemon


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for <tier>.json and summary.json")
    ap.add_argument("--tokens", type=int, default=4096, help="the long message's size (default 4096)")
    ap.add_argument("--model", default="qwen2.5-coder-0.5b",
                    help="scripts/fetch-model.sh name or GGUF path (default qwen2.5-coder-0.5b)")
    ap.add_argument("--tiers", default="host,disk", help="some of host,disk (default both)")
    ap.add_argument("--threads", type=int, default=2, help="the worker's threads (default 2)")
    ap.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--resume", action="store_true", help="skip tiers whose file exists")
    a = ap.parse_args()
    bins = live.Bins.at(a.bin_dir)
    if bins.missing():
        print(f"missing binaries: {bins.missing()} (build first)", file=sys.stderr)
        return 2
    os.makedirs(a.out, exist_ok=True)
    results = {}
    for tier in a.tiers.split(","):
        path = os.path.join(a.out, f"{tier}.json")
        if a.resume and os.path.exists(path):
            with open(path) as f:
                results[tier] = json.load(f)
            continue
        results[tier] = run_tier(tier, bins, a.model, a.tokens, a.threads, a.out)
        with open(path, "w") as f:
            json.dump(results[tier], f, indent=1)
    summary = {"command": " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]),
               "tiers": results}
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
