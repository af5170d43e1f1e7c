"""deploy/k8s (the Helm chart's rendering, test_helm_chart.py) against the
Kubernetes schemas and against polykvd itself (ctest k8s_manifests_test; the
python venv: kubernetes-validate)."""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
K8S = ROOT / "deploy" / "k8s"
BIN = Path(os.environ.get("POLYKV_BIN_DIR", ROOT / "build" / "bin"))
VERSIONS = ["1.30.0", "1.37.0"]  # the oldest and newest kubernetes-validate knows that we test


def manifests() -> dict:
    docs = {}
    for f in sorted(K8S.glob("*.yaml")):
        for d in yaml.safe_load_all(f.read_text()):
            docs[(d["kind"], d["metadata"]["name"])] = d
    return docs


DOCS = manifests()
CORE = [k for k in DOCS if k[0] != "ServiceMonitor"]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("key", CORE, ids=lambda k: f"{k[0]}/{k[1]}")
def test_manifests_pass_the_kubernetes_schemas_strictly(key, version):
    kubernetes_validate.validate(DOCS[key], version, strict=True)


def container():
    [c] = DOCS[("DaemonSet", "polykvd")]["spec"]["template"]["spec"]["containers"]
    return c


def args() -> dict:
    return dict(a[2:].split("=", 1) for a in container()["args"])


def test_the_service_monitor_selects_the_service_and_its_port():
    sm, svc = DOCS[("ServiceMonitor", "polykvd")], DOCS[("Service", "polykvd-metrics")]
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    labels = svc["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in sm["spec"]["selector"]["matchLabels"].items())
    ports = {p["name"] for p in svc["spec"]["ports"]}
    assert {e["port"] for e in sm["spec"]["endpoints"]} <= ports
    pod = DOCS[("DaemonSet", "polykvd")]["spec"]["template"]["metadata"]["labels"]
    assert all(pod.get(k) == v for k, v in svc["spec"]["selector"].items())


def test_the_config_map_holds_deploy_polykvd_yaml():
    data = DOCS[("ConfigMap", "polykvd-config")]["data"]["polykvd.yaml"]
    assert yaml.safe_load(data) == yaml.safe_load((ROOT / "deploy" / "polykvd.yaml").read_text())


def test_the_daemonset_matches_polykvd_and_its_config(tmp_path):
    c = container()
    a = args()
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert a["config"] == mounts["config"] + "/polykvd.yaml"
    assert os.path.dirname(a["socket"]) == mounts["sockets"]
    port = int(a["metrics-address"].rsplit(":", 1)[1])
    assert {p["name"]: p["containerPort"] for p in c["ports"]}["metrics"] == port
    # The ConfigMap's config is one polykvd accepts, with these flags.
    config = tmp_path / "polykvd.yaml"
    config.write_text(DOCS[("ConfigMap", "polykvd-config")]["data"]["polykvd.yaml"])
    out = subprocess.run([str(BIN / "polykvd"), "--config", str(config),
                          "--socket", a["socket"], "--metrics-address", a["metrics-address"],
                          "--print-config"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert f"metrics_address: {a['metrics-address']}" in out.stdout


def test_the_probes_are_what_polykvd_serves(tmp_path):
    c = container()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    daemon = subprocess.Popen([str(BIN / "polykvd"), "--config", str(ROOT / "deploy/polykvd.yaml"),
                               "--socket", str(tmp_path / "d.sock"),
                               "--metrics-address", f"127.0.0.1:{port}", "--pool-bytes", "64MiB",
                               "--log-level", "warn"])
    try:
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            path = c[probe]["httpGet"]["path"]
            assert c[probe]["httpGet"]["port"] == "metrics"
            for _ in range(100):
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}",
                                                timeout=5) as r:
                        assert r.status == 200, (probe, path)
                        break
                except (urllib.error.URLError, ConnectionError):
                    time.sleep(0.1)
            else:
                pytest.fail(f"{probe} {path}: no answer from polykvd")
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
