"""The Admin API of polykvd (what ``polykvctl`` uses) from Python.

    with polykv.Admin() as admin:
        admin.set_qos(polykv.Qos(agent_id="coder-1", policy="kvzip", budget_fraction=0.25))
        for s in admin.sessions():
            print(s.session_id, s.agent_id, s.bytes)

Field meanings: proto/polykv/v1/admin.proto and common.proto (bytes in
bytes, times in seconds). Page formats are their short names ("int4");
priorities are "best_effort", "low", "normal", "high", "critical".
"""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass, field
from typing import Optional

from . import _core
from .client import PAGE_FORMATS, default_socket

#: Priority classes in wire order (proto/polykv/v1/common.proto's PriorityClass).
PRIORITIES = tuple(_core.priority_names().split())
# Enums whose wire values are the page formats' (a DType's are the first three).
_FORMAT_FIELDS = {"key_precision_floor", "value_precision_floor", "key_format", "value_format",
                  "dtype"}


@dataclass
class Qos:
    """An agent's quality-of-service record (``polykvctl qos set``)."""

    agent_id: str
    priority: str = "unspecified"
    guaranteed_bytes: int = 0
    max_bytes: int = 0
    key_precision_floor: str = ""  # "" = none
    value_precision_floor: str = ""
    policy: str = ""
    budget_tokens: int = 0
    policy_note: str = ""  # output only: how the daemon runs the policy, if not as written
    key_format: str = ""  # "" = the model's dtype
    value_format: str = ""
    block_tokens: int = 0
    budget_fraction: float = 0.0
    uids: list[int] = field(default_factory=list)


@dataclass
class ModelProfileInfo:
    num_layers: int = 0
    num_kv_heads: int = 0
    head_dim: int = 0
    dtype: str = ""
    model_id: str = ""


@dataclass
class SessionStatus:
    """One open session as the daemon sees it (``polykvctl sessions``)."""

    session_id: int = 0
    agent_id: str = ""
    tenant: str = ""
    priority: str = "unspecified"
    reserved_tokens: int = 0
    committed_tokens: int = 0
    bytes: int = 0
    epoch: int = 0
    key_format: str = ""
    value_format: str = ""
    peer_pid: int = 0
    peer_uid: int = 0
    idle_seconds: float = 0.0
    profile: ModelProfileInfo = field(default_factory=ModelProfileInfo)


@dataclass
class PoolStats:
    tier: str = ""
    pool_bytes: int = 0
    arena_bytes: int = 0
    used_bytes: int = 0
    free_bytes: int = 0
    num_arenas: int = 0
    num_pages: int = 0
    superblock_bytes: int = 0
    num_superblocks_used: int = 0


@dataclass
class TenantStats:
    tenant: str = ""
    used_bytes: int = 0
    arena_bytes: int = 0
    num_sessions: int = 0


@dataclass
class Stats:
    """The pool and its tenants (``polykvctl status``)."""

    pool: PoolStats = field(default_factory=PoolStats)
    tenants: list[TenantStats] = field(default_factory=list)
    num_sessions: int = 0
    draining: bool = False
    metrics_address: str = ""
    lease_expiries: int = 0
    refused_reservations: int = 0
    version: str = ""
    uptime_seconds: float = 0.0


class Admin:
    """A connection to polykvd's Admin service (operators: polykvd's uid, root
    or admin_uids; others get PermissionDenied where the call needs it)."""

    def __init__(self, socket: Optional[str] = None, timeout_ms: int = 5000):
        self.socket = socket or default_socket()
        self._a = _core.Admin.connect(self.socket, timeout_ms)

    def stats(self) -> Stats:
        return _decode(Stats, json.loads(self._a.stats_json()))

    def sessions(self, tenant: str = "", agent_id: str = "") -> list[SessionStatus]:
        """Open sessions, optionally of one tenant and/or agent."""
        d = json.loads(self._a.sessions_json(tenant, agent_id))
        return [_decode(SessionStatus, s) for s in d.get("sessions", [])]

    def get_qos(self, agent_id: str) -> Qos:
        return _decode(Qos, json.loads(self._a.get_qos_json(agent_id)))

    def set_qos(self, qos: Qos) -> Qos:
        """Sets an agent's QoS; returns the record as the daemon stored it."""
        return _decode(Qos, json.loads(self._a.set_qos_json(json.dumps(_encode(qos)))))

    def evict(self, session_id: int) -> int:
        """Evicts a session; returns the bytes freed."""
        return self._a.evict(session_id)

    def drain(self, evict_after_ms: int = 0) -> int:
        """Stops admitting sessions; returns how many were open."""
        return self._a.drain(evict_after_ms)

    def move(self, session_id: int, target: str, wait_ms: int = 0) -> int:
        """Moves a session to the polykvd whose peer listener is ``target``
        (host:port; both daemons need peer TLS: docs/moving-sessions.md),
        waiting up to ``wait_ms`` (0: 30 s) for its worker to park; returns
        its id there."""
        return self._a.move(session_id, target, wait_ms)

    def close(self) -> None:
        self._a = None

    def __enter__(self) -> "Admin":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _format_name(wire: int) -> str:
    return PAGE_FORMATS[wire - 1] if 0 < wire <= len(PAGE_FORMATS) else ""


def _decode(cls, d: dict):
    """A dataclass from proto3 JSON: 64-bit integers arrive as strings and
    enums as numbers."""
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in d:
            continue
        v, t = d[f.name], hints[f.name]
        if f.name in _FORMAT_FIELDS:
            v = _format_name(int(v))
        elif f.name == "priority":
            v = PRIORITIES[int(v)] if 0 <= int(v) < len(PRIORITIES) else "unspecified"
        elif dataclasses.is_dataclass(t):
            v = _decode(t, v)
        elif typing.get_origin(t) is list:
            (item,) = typing.get_args(t)
            v = [_decode(item, x) if dataclasses.is_dataclass(item) else item(x) for x in v]
        else:
            v = t(v)
        kwargs[f.name] = v
    return cls(**kwargs)


def _encode(qos: Qos) -> dict:
    d = dataclasses.asdict(qos)
    for name in _FORMAT_FIELDS & d.keys():
        if d[name] and d[name] not in PAGE_FORMATS:
            raise ValueError(f"Qos.{name} {d[name]!r} is not a page format "
                             f"({', '.join(PAGE_FORMATS)})")
        d[name] = PAGE_FORMATS.index(d[name]) + 1 if d[name] else 0
    if qos.priority not in PRIORITIES:
        raise ValueError(f"Qos.priority {qos.priority!r} is not one of {', '.join(PRIORITIES)}")
    d["priority"] = PRIORITIES.index(qos.priority)
    del d["policy_note"]
    return d
