#!/usr/bin/env python3
"""An agent's session offloaded while it waits comes back token for token.

The reference worker chats three messages on polykvd (the shipped default
QoS). While it waits for its next message (its worker said Idle), the
session's pages leave the pool and come back at the worker's next Sync:
  - host tier: after each of the first two turns, by `polykvctl offload`;
  - disk tier only: the same, the pages in a checksummed file meanwhile;
  - by the idle timer (offload.idle_ms), nobody asking.
Every conversation's text must equal the one that never left the pool. The
daemon's own accounting check (polykv_pool_invariants_ok) holds after each;
the restores are counted and timed in its metrics. A worker SIGKILLed while
its session is on disk leaves nothing behind: the lease reclaims the
session, the file goes, the pool's bytes are zero.

  offload_test.py BIN_DIR
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from polykvd_process import Polykvd

def daemon(bin_dir, tmp, name, extra):
    """Checks its accounting on each scrape; a dead worker's lease ends in 1 s."""
    return Polykvd(bin_dir, tmp, name, ["--check-invariants-on-scrape", "--lease-ms", "1000"] +
                   extra, metrics=True)


MESSAGES = ["Write a Python function that returns the square of a number.",
            "Now make it work for a list of numbers.",
            "Add a docstring to it."]
WORKER = ["--max-new-tokens", "24", "--threads", "1"]


class Chat:
    """polykv-worker chat: one message in, the turn's end read from stderr."""

    def __init__(self, bin_dir, daemon):
        self.proc = subprocess.Popen(
            [os.path.join(bin_dir, "polykv-worker"), "chat", "--daemon", daemon.socket] + WORKER,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def say(self, message):
        self.proc.stdin.write(message + "\n")
        self.proc.stdin.flush()
        while True:  # the turn's statistics line ends it
            line = self.proc.stderr.readline()
            if not line:
                raise AssertionError(f"worker ended: {self.proc.wait()}")
            if "generated tokens" in line:
                return

    def finish(self):
        out, err = self.proc.communicate(timeout=300)
        assert self.proc.returncode == 0, f"worker failed ({self.proc.returncode}): {err}"
        return out


def converse(bin_dir, daemon, between=None):
    """The three messages; between(turn) after each of the first two."""
    chat = Chat(bin_dir, daemon)
    for turn, message in enumerate(MESSAGES):
        chat.say(message)
        if between is not None and turn < len(MESSAGES) - 1:
            between(turn)
    return chat.finish()


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print(f"ok: {what}")


def offload_by_ctl(daemon, tier):
    def between(turn):
        [s] = daemon.sessions()
        r = subprocess.run(daemon.ctl + ["offload", str(s["session_id"]), "--json"],
                           capture_output=True, text=True)
        check(r.returncode == 0, f"turn {turn}: polykvctl offload ({r.stderr.strip()})")
        report = json.loads(r.stdout)
        check(report["tier"] == tier and int(report["bytes"]) > 0,
              f"turn {turn}: {report['bytes']} bytes went to {tier}")
        [s] = daemon.sessions()
        check(s.get("offloaded_to") == tier and int(s.get("bytes", 0)) == 0,
              f"turn {turn}: the session holds no pool bytes while offloaded")
    return between


def wait_until(cond, what, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out: {what}")


def main(bin_dir):
    tmp = tempfile.mkdtemp(prefix="polykv-offload-")
    daemons = []
    try:
        ref = daemon(bin_dir, tmp, "ref", [])
        daemons.append(ref)
        want = converse(bin_dir, ref)
        check(len(want.strip()) > 0, "the reference conversation answered")

        host = daemon(bin_dir, tmp, "host", ["--offload-host-bytes", "64MiB"])
        daemons.append(host)
        got = converse(bin_dir, host, offload_by_ctl(host, "host"))
        check(got == want, "offloaded to host memory twice: the same conversation")
        check(host.metric("polykv_pool_invariants_ok") == 1, "host: the accounting holds")
        check(host.metric("polykv_restore_seconds_count") == 2, "host: two restores timed")
        status = subprocess.run(host.ctl + ["status"], capture_output=True, text=True).stdout
        check("offloaded 2, restored 2" in status, "polykvctl status: the offload line")

        disk_dir = os.path.join(tmp, "offload")
        disk = daemon(bin_dir, tmp, "disk", ["--offload-dir", disk_dir,
                                             "--offload-disk-bytes", "256MiB"])
        daemons.append(disk)
        got = converse(bin_dir, disk, offload_by_ctl(disk, "disk"))
        check(got == want, "offloaded to disk twice: the same conversation")
        check(disk.metric("polykv_pool_invariants_ok") == 1, "disk: the accounting holds")
        check(os.listdir(disk_dir) == [], "disk: no file left once restored")

        # A worker killed while its session is on disk.
        chat = Chat(bin_dir, disk)
        chat.say(MESSAGES[0])
        offload_by_ctl(disk, "disk")(0)
        check(len(os.listdir(disk_dir)) == 1, "the offloaded session is one file")
        chat.proc.send_signal(signal.SIGKILL)
        chat.proc.wait()
        wait_until(lambda: disk.sessions() == [], "the lease reclaims the killed worker's session")
        check(os.listdir(disk_dir) == [], "its file is gone")
        stats = disk.stats()
        check(int(stats["pool"].get("usedBytes", stats["pool"].get("used_bytes", 0))) == 0,
              "the pool holds nothing")
        check(disk.metric("polykv_pool_invariants_ok") == 1, "the accounting holds after it")

        timer = daemon(bin_dir, tmp, "timer", ["--offload-host-bytes", "64MiB",
                                               "--offload-idle-ms", "100"])
        daemons.append(timer)

        def idle_offloaded(turn):
            wait_until(lambda: timer.sessions()[0].get("offloaded_to") == "host",
                       f"turn {turn}: the idle timer offloads the waiting session")
        got = converse(bin_dir, timer, idle_offloaded)
        check(got == want, "offloaded by the idle timer: the same conversation")
        check(timer.metric("polykv_offload_total{result=\"restored\"}") == 2,
              "timer: two restores counted")
        return 0
    finally:
        for d in daemons:
            d.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
