#!/usr/bin/env python3
"""Checks of deploy/systemd/polykvd.service (ctest systemd_unit_test,
systemd_syscalls_test).

  check_systemd_unit.py verify BIN_DIR    systemd-analyze verify finds nothing
      to say about the unit (ExecStart pointed at BIN_DIR/polykvd), and the
      hardening options the docs promise are set.
  check_systemd_unit.py syscalls BIN_DIR  every system call polykvd makes
      while serving a worker, a metrics scrape and polykvctl (traced with
      strace) is one the unit's SystemCallFilter allows; exit 77 (skip)
      where this sandbox forbids ptrace.
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
UNIT = os.path.join(ROOT, "deploy", "systemd", "polykvd.service")
HARDENING = {
    "NoNewPrivileges": "true", "CapabilityBoundingSet": "", "ProtectSystem": "strict",
    "ProtectHome": "true", "PrivateTmp": "true", "ProtectKernelTunables": "true",
    "ProtectKernelModules": "true", "ProtectControlGroups": "true",
    "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6", "RestrictNamespaces": "true",
    "RestrictSUIDSGID": "true", "LockPersonality": "true", "SystemCallArchitectures": "native",
    "RuntimeDirectory": "polykv", "RuntimeDirectoryMode": "0750", "UMask": "0077",
}


def unit_settings() -> dict:
    settings = {}
    for line in open(UNIT):
        m = re.match(r"^(\w+)=(.*)$", line.strip())
        if m:
            settings[m.group(1)] = m.group(2)
    return settings


def verify(bin_dir: str) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        unit = os.path.join(tmp, "polykvd.service")
        text = open(UNIT).read().replace("/usr/local/bin/polykvd",
                                         os.path.join(bin_dir, "polykvd"))
        open(unit, "w").write(text)
        r = subprocess.run(["systemd-analyze", "verify", unit], capture_output=True, text=True)
    said = (r.stdout + r.stderr).strip()
    if r.returncode != 0 or said:
        print(f"systemd-analyze verify (rc {r.returncode}):\n{said}")
        return 1
    settings = unit_settings()
    wrong = {k: (settings.get(k), v) for k, v in HARDENING.items() if settings.get(k) != v}
    if wrong:
        print("hardening options missing or different (found, wanted):", wrong)
        return 1
    print(f"verified; {len(HARDENING)} hardening options set")
    return 0


def expand(group: str) -> set:
    out = subprocess.run(["systemd-analyze", "syscall-filter", group], capture_output=True,
                         text=True, check=True).stdout
    names = set()
    for line in out.splitlines()[1:]:
        item = line.strip()
        if item and not item.startswith("#"):
            names |= expand(item) if item.startswith("@") else {item}
    return names


def syscalls(bin_dir: str) -> int:
    if shutil.which("strace") is None:
        print("strace is not installed (scripts/install-deps.sh installs it)")
        return 1
    if subprocess.run(["strace", "-o", "/dev/null", "true"], capture_output=True).returncode:
        print("this sandbox forbids ptrace: skipped")
        return 77
    allowed = set()
    for group in unit_settings()["SystemCallFilter"].split():
        allowed |= expand(group) if group.startswith("@") else {group}
    with tempfile.TemporaryDirectory() as tmp:
        sock, trace = os.path.join(tmp, "d.sock"), os.path.join(tmp, "trace")
        port = 19000 + os.getpid() % 1000
        daemon = subprocess.Popen(
            ["strace", "-f", "-qq", "-o", trace, os.path.join(bin_dir, "polykvd"),
             "--socket", sock, "--metrics-address", f"127.0.0.1:{port}", "--log-level", "warn"])
        try:
            for _ in range(200):
                if os.path.exists(sock):
                    break
                time.sleep(0.1)
            subprocess.run([os.path.join(bin_dir, "polykv-test-worker"), "run", "--socket", sock,
                            "--tenant", "t", "--agent", "a", "--tokens", "300", "--seed", "1"],
                           check=True, capture_output=True)
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
            subprocess.run([os.path.join(bin_dir, "polykvctl"), "--socket", sock, "status"],
                           check=True, capture_output=True)
        finally:
            # SIGTERM to polykvd itself (it drains and exits), not to strace,
            # which would detach and leave it running; SIGKILL if it hangs.
            children = [int(p) for p in
                        open(f"/proc/{daemon.pid}/task/{daemon.pid}/children").read().split()]
            for sig in (signal.SIGTERM, signal.SIGKILL):
                for pid in children:
                    try:
                        os.kill(pid, sig)
                    except ProcessLookupError:
                        pass
                try:
                    daemon.wait(timeout=60)
                    break
                except subprocess.TimeoutExpired:
                    daemon.kill()
        used = set(re.findall(r"^\d+\s+(?:<\.\.\. )?([a-z_0-9]+)\(", open(trace).read(), re.M))
    outside = sorted(used - allowed - {"execve"})  # execve: strace starting polykvd
    if not used or outside:
        print(f"{len(used)} system calls traced; outside SystemCallFilter: {outside}")
        return 1
    print(f"{len(used)} system calls traced, all allowed by SystemCallFilter")
    return 0


if __name__ == "__main__":
    mode, bin_dir = sys.argv[1], sys.argv[2]
    sys.exit(verify(bin_dir) if mode == "verify" else syscalls(bin_dir))
