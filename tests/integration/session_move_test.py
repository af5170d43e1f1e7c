#!/usr/bin/env python3
"""A conversation moved between two polykvd mid-way continues token for token.

Two daemons on this machine, a peer link between them (gRPC over TCP with
mutual TLS, certificates from scripts/make-peer-certs.sh), and the reference
worker running a three-turn agent script on daemon A. After its first turn,
`polykvctl move` sends the session to daemon B; the worker parks at its next
step boundary, follows the session to B and finishes there. Its answers must
equal those of the same script on A without a move: with the shipped default
QoS (int8 keys, int4 values), and with a QoS whose policy compacts the
session (so the policy's slot records, moved with it, decide what stays).
A move to a daemon whose certificate another CA signed fails, and the
conversation goes on at A, again token for token.

  session_move_test.py BIN_DIR
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

from polykvd_process import Polykvd, free_port

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tests/fixtures/worker/scripts/coder.jsonl")
# A policy that compacts this short script many times: 16-token pages,
# 48 tokens kept (the worker's 3 turns run to ~270 tokens).
COMPACTING = ["--policy", "h2o", "--budget-tokens", "48", "--block-tokens", "16",
              "--budget-fraction", "0"]


def daemon(bin_dir, tmp, name, pki, cert, listen):
    """With a peer certificate; `listen`: the peer listener on a free port."""
    args = ["--peer-cert", os.path.join(pki, f"{cert}.pem"),
            "--peer-key", os.path.join(pki, f"{cert}.key"),
            "--peer-ca", os.path.join(pki, "ca.pem")]
    port = free_port() if listen else None
    if listen:
        args += ["--peer-address", f"127.0.0.1:{port}"]
    d = Polykvd(bin_dir, tmp, name, args)
    d.port = port
    return d


def texts(lines):
    return [json.loads(line)["text"] for line in lines if line.strip()]


def run_worker(bin_dir, daemon, move=None):
    """The script on `daemon`; with move(session_id) called after turn 1."""
    worker = subprocess.Popen([os.path.join(bin_dir, "polykv-worker"), "run", SCRIPT,
                               "--max-new-tokens", "32", "--daemon", daemon.socket],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = [worker.stdout.readline()]
    moved = None
    if move is not None:
        sessions = daemon.sessions()
        assert len(sessions) == 1, sessions
        moved = move(int(sessions[0]["session_id"]))
    rest, err = worker.communicate(timeout=600)
    assert worker.returncode == 0, f"worker failed ({worker.returncode}): {err}"
    lines += rest.splitlines()
    out = texts(lines)
    assert len(out) == 3, f"expected 3 turns, got {len(out)}: {lines} {err}"
    return out, moved


def move_to(source, target):
    def move(session_id):
        r = subprocess.run(source.ctl + ["move", str(session_id), "--to",
                                         f"127.0.0.1:{target.port}", "--json"],
                           capture_output=True, text=True)
        return r
    return move


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print(f"ok: {what}")


def main(bin_dir):
    tmp = tempfile.mkdtemp(prefix="polykv-move-")
    pki, rogue = os.path.join(tmp, "pki"), os.path.join(tmp, "rogue")
    for d, names in ((pki, ["a", "b"]), (rogue, ["c"])):
        for n in names:
            subprocess.run(["bash", os.path.join(ROOT, "scripts/make-peer-certs.sh"), d, n],
                           check=True, capture_output=True)
    daemons = []
    try:
        a = daemon(bin_dir, tmp, "a", pki, "a", listen=False)
        daemons.append(a)
        b = daemon(bin_dir, tmp, "b", pki, "b", listen=True)
        daemons.append(b)
        c = daemon(bin_dir, tmp, "c", rogue, "c", listen=True)
        daemons.append(c)

        for qos, name in ((None, "shipped default QoS"), (COMPACTING, "a compacting QoS")):
            if qos is not None:
                for d in (a, b):
                    d.qos("agent-0", qos)
            stay, _ = run_worker(bin_dir, a)
            moved, r = run_worker(bin_dir, a, move_to(a, b))
            check(r.returncode == 0, f"{name}: polykvctl move succeeded ({r.stderr.strip()})")
            report = json.loads(r.stdout)
            print(f"  moved: {report}")
            check(report["tokens"] > 0 and report["bytes"] > 0,
                  f"{name}: the move carried the first turn's tokens and pages")
            check(moved == stay, f"{name}: the moved conversation equals the unmoved one")
            check(a.sessions() == [] and b.sessions() == [],
                  f"{name}: no session left on either daemon after the worker closed")
            check("attached (moved here)" in open(b.log_path).read(),
                  f"{name}: the worker attached at the target")

        # The target's certificate is another CA's: the handshake fails, the
        # session stays at A and the worker goes on there.
        failed, r = run_worker(bin_dir, a, move_to(a, c))
        check(r.returncode != 0 and "stays here" in r.stderr,
              f"a move to a daemon of another CA fails ({r.stderr.strip()})")
        check(failed == stay, "after the failed move the conversation equals the unmoved one")
        check("moved here" not in open(c.log_path).read(), "the other CA's daemon got nothing")

        # An unknown session: nothing to move.
        r = subprocess.run(b.ctl + ["move", "12345", "--to", f"127.0.0.1:{c.port}"],
                           capture_output=True, text=True)
        check(r.returncode != 0 and "no session" in r.stderr,
              f"moving an unknown session fails ({r.stderr.strip()})")
        return 0
    finally:
        for d in daemons:
            d.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
