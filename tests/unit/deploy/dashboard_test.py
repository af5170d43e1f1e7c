#!/usr/bin/env python3
"""dashboards/polykvd-pool.json against a real Prometheus scraping a real
polykvd under a workload (ctest dashboard_test).

  dashboard_test.py BIN_DIR

The dashboard's JSON is checked for structure (unique panel ids, a Prometheus
data source, the instance selector, every target with a refId and an expr).
Then: polykvd with a small pool; Prometheus (Debian's, scraping every second)
with deploy/prometheus/alerts.yml loaded; a workload through the product
path: QoS set with polykvctl, polykv-test-worker agents of two tenants
(compacted by h2o, or growing under "full" until the pool's ladder acts), a
forged token (an RPC error), a worker stopped until its lease expires, more
idle connections than one uid may hold, and (as root) a peer of another uid.
Every
target's PromQL, with $instance set to the daemon's target as Grafana would,
must return series.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
DASHBOARD = os.path.join(ROOT, "dashboards", "polykvd-pool.json")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_structure(d: dict) -> list:
    problems = []
    ids = [p.get("id") for p in d["panels"]]
    if len(set(ids)) != len(ids):
        problems.append(f"panel ids repeat: {ids}")
    names = {v["name"]: v for v in d.get("templating", {}).get("list", [])}
    if names.get("datasource", {}).get("query") != "prometheus":
        problems.append("no Prometheus data source variable")
    if "instance" not in names or not names["instance"].get("multi"):
        problems.append("no multi-valued instance selector")
    for p in d["panels"]:
        for key in ("type", "title", "gridPos", "datasource", "targets"):
            if key not in p:
                problems.append(f"panel {p.get('id')}: no {key}")
        refs = [t.get("refId") for t in p.get("targets", [])]
        if len(set(refs)) != len(refs) or not all(refs):
            problems.append(f"panel {p.get('title')}: refIds {refs}")
        for t in p.get("targets", []):
            if '$instance' not in t.get("expr", ""):
                problems.append(f"panel {p.get('title')}: {t.get('expr')} ignores $instance")
    return problems


def query(port: int, expr: str) -> list:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise RuntimeError(f"{expr}: {body}")
    return body["data"]["result"]


def main(bin_dir: str) -> int:
    dashboard = json.load(open(DASHBOARD))
    problems = check_structure(dashboard)
    if problems:
        print("dashboard structure:\n  " + "\n  ".join(problems))
        return 1
    tmp = tempfile.mkdtemp(prefix="polykv-dashboard-")
    sock = os.path.join(tmp, "polykvd.sock")
    metrics, web = free_port(), free_port()
    procs = []

    def start(argv, **kw):
        p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kw)
        procs.append(p)
        return p

    try:
        start([os.path.join(bin_dir, "polykvd"), "--socket", sock, "--pool-bytes", "8MiB",
               "--arena-bytes", "2MiB", "--low-watermark-bytes", "2MiB", "--lease-ms", "1000",
               "--metrics-address", f"127.0.0.1:{metrics}", "--log-level", "warn"])
        config = os.path.join(tmp, "prometheus.yml")
        with open(config, "w") as f:
            f.write(f"global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n"
                    f"rule_files: [{os.path.join(ROOT, 'deploy/prometheus/alerts.yml')}]\n"
                    f"scrape_configs:\n  - job_name: polykvd\n    static_configs:\n"
                    f"      - targets: ['127.0.0.1:{metrics}']\n")
        start(["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp}/tsdb",
               f"--web.listen-address=127.0.0.1:{web}"])
        for _ in range(300):
            if os.path.exists(sock):
                break
            time.sleep(0.1)
        ctl = [os.path.join(bin_dir, "polykvctl"), "--socket", sock]
        worker = os.path.join(bin_dir, "polykv-test-worker")
        for i in range(8):
            policy = ["--policy", "h2o", "--budget-tokens", "64"] if i < 4 else \
                ["--policy", "full"]
            subprocess.run(ctl + ["qos", "set", f"dash-{i}"] + policy, check=True,
                           capture_output=True)
        # A worker that stops heartbeating: its lease expires.
        hung = start([worker, "hang", "--socket", sock, "--tenant", "t-hang", "--agent", "hung",
                      "--tokens", "64", "--seed", "9"])
        time.sleep(1)
        hung.send_signal(signal.SIGSTOP)
        agents = [start([worker, "agent", "--socket", sock, "--tenant", f"t-{i % 2}",
                         "--agent", f"dash-{i}", "--tokens", "2048", "--seed", str(i),
                         "--step", "16"]) for i in range(8)]
        subprocess.run([worker, "forge", "--socket", sock, "--session", "1", "--token", "00"],
                       capture_output=True)
        for a in agents:
            a.wait(timeout=300)
        # A session open while Prometheus scrapes (sessions by priority). Its
        # lease is long (the daemon's 1 s is for the hung worker above), and
        # its reservation may be refused while the pressure ladder still
        # refuses after the workload: then it tries again.
        deadline = time.monotonic() + 120
        while True:
            held = subprocess.Popen([worker, "hang", "--socket", sock, "--tenant", "t-open",
                                     "--agent", "open", "--tokens", "64", "--seed", "10",
                                     "--lease-ms", "60000"], stdout=subprocess.PIPE, text=True)
            procs.append(held)
            line = held.stdout.readline()  # its session is open (before the idle connections)
            if json.loads(line or "{}").get("ok"):
                break
            held.kill()
            print(f"the held session was refused, trying again: {line.strip()}")
            if time.monotonic() > deadline:
                print(f"the held session did not open: {line}")
                return 1
            time.sleep(1)
        # More idle connections than max_connections_per_uid (64): refused.
        idle = []
        for _ in range(72):
            c = socket.socket(socket.AF_UNIX)
            c.connect(sock)
            idle.append(c)
        # A peer of another uid: the credential check rejects it (root can
        # open the socket to it; others cannot make this event).
        if os.getuid() == 0:
            os.chmod(tmp, 0o755)
            os.chmod(sock, 0o666)
            subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] + ctl +
                           ["status"], capture_output=True)
        # Every panel must show series: poll each expression until it does,
        # up to a deadline (Prometheus scrapes every second, but on a loaded
        # or freshly set-up machine its first scrapes and rule evaluations
        # can lag the workload by many seconds).
        instance = f"127.0.0.1:{metrics}"
        waiting = []
        for p in dashboard["panels"]:
            for t in p["targets"]:
                expr = t["expr"].replace("$instance", instance)
                if os.getuid() != 0 and "peer_rejections" in expr:
                    print(f"not root: no peer of another uid, {expr} not checked")
                    continue
                waiting.append((p["title"], expr))
        deadline = time.monotonic() + 120
        while True:
            waiting = [(title, expr) for title, expr in waiting if not query(web, expr)]
            if not waiting or time.monotonic() > deadline:
                break
            time.sleep(1)
        empty = [f"{title}: {expr}" for title, expr in waiting]
        for c in idle:
            c.close()
        print(f"{sum(len(p['targets']) for p in dashboard['panels'])} targets of "
              f"{len(dashboard['panels'])} panels queried")
        if empty:
            print("no series:\n  " + "\n  ".join(empty))
            return 1
        return 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
