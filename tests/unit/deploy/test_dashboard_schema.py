"""dashboards/polykvd-pool.json against Grafana's own dashboard model
(grafana-foundation-sdk, generated from Grafana's schema): decoded and
encoded again, nothing may be lost, so every key is one Grafana knows where
it stands (ctest dashboard_schema_test; its queries against a real
Prometheus: dashboard_test)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import Dashboard

DASHBOARD = Path(__file__).resolve().parents[3] / "dashboards" / "polykvd-pool.json"


def lost(original, again, path="") -> list[str]:
    """Where `again` (the round trip) lacks or changed what `original` has."""
    if isinstance(original, dict):
        if not isinstance(again, dict):
            return [path or "/"]
        return [p for k, v in original.items()
                for p in ([f"{path}/{k}"] if k not in again else lost(v, again[k], f"{path}/{k}"))]
    if isinstance(original, list):
        if not isinstance(again, list) or len(again) != len(original):
            return [path]
        return [p for i, (a, b) in enumerate(zip(original, again))
                for p in lost(a, b, f"{path}[{i}]")]
    return [] if original == again else [path]


def round_trip(d: dict) -> dict:
    return json.loads(json.dumps(Dashboard.from_json(d), cls=JSONEncoder))


def test_every_key_of_the_dashboard_is_grafanas():
    d = json.loads(DASHBOARD.read_text())
    assert lost(d, round_trip(d)) == []
    assert d["panels"] and all(p["type"] == "timeseries" for p in d["panels"])


def test_the_check_sees_a_misspelled_key():
    d = json.loads(DASHBOARD.read_text())
    bad = copy.deepcopy(d)
    bad["panels"][0]["gridpos"] = bad["panels"][0].pop("gridPos")
    bad["refresh_rate"] = "10s"
    assert lost(bad, round_trip(bad)) == ["/panels[0]/gridpos", "/refresh_rate"]
