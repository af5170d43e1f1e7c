"""The Helm chart (deploy/helm/polykvd), rendered by the real helm binary
(scripts/fetch-helm.sh): it lints, renders the plain manifests of deploy/k8s
with its default values, and renders valid, consistent manifests with other
values (ctest helm_chart_test; the python venv: kubernetes-validate)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "deploy" / "helm" / "polykvd"
VERSIONS = ["1.30.0", "1.37.0"]  # as test_k8s_manifests.py


def helm() -> str:
    out = subprocess.run(["bash", str(ROOT / "scripts" / "fetch-helm.sh")], capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


HELM = helm()


def render(*sets: str, namespace: str = "polykv") -> dict:
    args = [HELM, "template", "polykvd", str(CHART), "--namespace", namespace]
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return {(d["kind"], d["metadata"]["name"]): d
            for d in yaml.safe_load_all(out.stdout) if d}


def container(docs: dict) -> dict:
    [c] = docs[("DaemonSet", "polykvd")]["spec"]["template"]["spec"]["containers"]
    return c


def test_the_chart_lints_strictly():
    out = subprocess.run([HELM, "lint", "--strict", str(CHART)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_deploy_k8s_is_the_charts_rendering():
    out = subprocess.run(["bash", str(ROOT / "scripts" / "render-k8s.sh"), "--check"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_no_service_monitor_unless_asked():
    assert ("ServiceMonitor", "polykvd") not in render()
    assert ("ServiceMonitor", "polykvd") in render("serviceMonitor.enabled=true")


OTHER = ("socketDir=/var/run/pkv", "metricsPort=9500", "image.tag=1.2.3", "runAsUser=2000",
         "runAsGroup=2001", "nodeSelector=null", "serviceMonitor.enabled=true")


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("sets", [(), OTHER], ids=["defaults", "other-values"])
def test_every_rendered_manifest_passes_the_kubernetes_schemas(sets, version):
    for key, doc in render(*sets).items():
        if key[0] == "ServiceMonitor":  # a CRD the schemas do not know
            continue
        kubernetes_validate.validate(doc, version, strict=True)


def test_other_values_reach_every_place_that_uses_them():
    docs = render(*OTHER, namespace="agents")
    c = container(docs)
    args = dict(a[2:].split("=", 1) for a in c["args"])
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert args["socket"] == "/var/run/pkv/polykvd.sock" and mounts["sockets"] == "/var/run/pkv"
    pod = docs[("DaemonSet", "polykvd")]["spec"]["template"]["spec"]
    [sockets] = [v for v in pod["volumes"] if v["name"] == "sockets"]
    assert sockets["hostPath"]["path"] == "/var/run/pkv"
    assert args["metrics-address"] == "0.0.0.0:9500"
    assert c["ports"] == [{"name": "metrics", "containerPort": 9500, "protocol": "TCP"}]
    assert docs[("Service", "polykvd-metrics")]["spec"]["ports"][0]["port"] == 9500
    assert c["image"] == "polykv/polykvd:1.2.3"
    assert pod["securityContext"]["runAsUser"] == 2000
    assert pod["securityContext"]["runAsGroup"] == pod["securityContext"]["fsGroup"] == 2001
    assert "nodeSelector" not in pod
    assert {d["metadata"]["namespace"] for d in docs.values()} == {"agents"}
    # The ServiceMonitor selects the Service, the Service the DaemonSet's pods.
    sm, svc = docs[("ServiceMonitor", "polykvd")], docs[("Service", "polykvd-metrics")]
    labels = docs[("DaemonSet", "polykvd")]["spec"]["template"]["metadata"]["labels"]
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert svc["spec"]["selector"].items() <= labels.items()


PEER = ("peer.enabled=true", "peer.port=7171", "peer.tlsSecret=polykvd-peer-tls")


@pytest.mark.parametrize("version", VERSIONS)
def test_the_peer_listener_renders_valid_manifests(version):
    for key, doc in render(*PEER).items():
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_peer_listener_gets_its_port_certificates_and_nothing_without_it():
    c = container(render(*PEER))
    args = dict(a[2:].split("=", 1) for a in c["args"])
    assert args["peer-address"] == "0.0.0.0:7171"
    assert {args["peer-cert"], args["peer-key"], args["peer-ca"]} == {
        "/etc/polykv/peer/tls.crt", "/etc/polykv/peer/tls.key", "/etc/polykv/peer/ca.crt"}
    assert {"name": "peer", "containerPort": 7171, "protocol": "TCP"} in c["ports"]
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert mounts["peer-tls"] == "/etc/polykv/peer"
    pod = render(*PEER)[("DaemonSet", "polykvd")]["spec"]["template"]["spec"]
    [tls] = [v for v in pod["volumes"] if v["name"] == "peer-tls"]
    assert tls["secret"]["secretName"] == "polykvd-peer-tls"
    # Off by default: no listener, no certificates mounted.
    plain = container(render())
    assert not any(a.startswith("--peer") for a in plain["args"])
    assert all(m["name"] != "peer-tls" for m in plain["volumeMounts"])
    # On without a Secret: helm refuses, naming the value.
    out = subprocess.run([HELM, "template", "polykvd", str(CHART), "--set", "peer.enabled=true"],
                         capture_output=True, text=True)
    assert out.returncode != 0 and "peer.tlsSecret" in out.stderr


def test_a_config_of_ones_own_replaces_the_default_and_rolls_the_pods():
    default = render()
    mine = render("config=pool_bytes: 2GiB\n")
    assert yaml.safe_load(mine[("ConfigMap", "polykvd-config")]["data"]["polykvd.yaml"]) == {
        "pool_bytes": "2GiB"}

    def checksum(docs):
        return docs[("DaemonSet", "polykvd")]["spec"]["template"]["metadata"]["annotations"][
            "checksum/config"]

    assert checksum(mine) != checksum(default)
