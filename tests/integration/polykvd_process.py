"""A polykvd process for the Python integration tests (offload_test.py,
session_move_test.py): started with the test's flags, waited for, stopped;
polykvctl beside it for what the test reads."""

import json
import os
import socket
import subprocess
import time
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Polykvd:
    """polykvd on TMP/NAME.sock (log TMP/NAME.log), 256 MiB pool, with `args`;
    `metrics`: a /metrics server on a free port (self.metrics_port)."""

    def __init__(self, bin_dir, tmp, name, args, metrics=False):
        self.socket = os.path.join(tmp, f"{name}.sock")
        self.log_path = os.path.join(tmp, f"{name}.log")
        self.metrics_port = free_port() if metrics else None
        address = f"127.0.0.1:{self.metrics_port}" if metrics else "off"
        argv = [os.path.join(bin_dir, "polykvd"), "--socket", self.socket,
                "--metrics-address", address, "--pool-bytes", "256MiB"] + list(args)
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=self.log)
        self.ctl = [os.path.join(bin_dir, "polykvctl"), "--socket", self.socket]
        for _ in range(100):
            if os.path.exists(self.socket) and "listening" in open(self.log_path).read():
                return
            time.sleep(0.1)
        raise AssertionError(f"{name} did not start: {open(self.log_path).read()}")

    def sessions(self):
        out = subprocess.run(self.ctl + ["sessions", "--json"], check=True,
                             capture_output=True, text=True).stdout
        d = json.loads(out)
        return d if isinstance(d, list) else d.get("sessions", [])

    def stats(self):
        out = subprocess.run(self.ctl + ["status", "--json"], check=True,
                             capture_output=True, text=True).stdout
        return json.loads(out)

    def qos(self, agent, args):
        subprocess.run(self.ctl + ["qos", "set", agent] + args, check=True, capture_output=True)

    def metric(self, name):
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                      timeout=10).read().decode()
        for line in text.splitlines():
            if line.split(" ")[0] == name:
                return float(line.split(" ")[-1])
        raise AssertionError(f"no {name} in /metrics")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()
