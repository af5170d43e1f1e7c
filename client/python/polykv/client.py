"""Sessions and pages of polykvd (libpolykv_client from Python).

A worker opens a session for its model's KV shape, reserves pages ahead of
need, writes its keys and values into them in place (the pages are the
daemon's shared memory, mapped into this process), commits tokens in batches
and, at step boundaries, syncs: when the daemon compacted the session, the
block table changes and the worker adopts it.

    with polykv.Client() as client:
        profile = polykv.ModelProfile(num_layers=24, num_kv_heads=2, head_dim=64)
        with client.open_session("coder-1", profile, tenant="team-a") as s:
            blocks = s.reserve(256)
            keys = s.page(0, 0)          # uint8 view of layer 0's key page
            ...
            s.commit(200)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Optional, Sequence

import numpy as np

from . import _core

#: polykvd's socket unless POLYKV_SOCKET says otherwise.
DEFAULT_SOCKET = "/run/polykv/polykvd.sock"


def default_socket() -> str:
    """``$POLYKV_SOCKET``, else :data:`DEFAULT_SOCKET`."""
    return os.environ.get("POLYKV_SOCKET", DEFAULT_SOCKET)


#: Page formats in wire order: "f32 f16 bf16 fp8 int8 int4 int2".
PAGE_FORMATS = tuple(_core.format_names().split())

#: What a worker measures for the daemon's policy, in wire order:
#: "attention intent importance observation entropy" (policies/score_stream.h
#: says each one's shape and how the daemon folds a report in).
SCORE_STREAMS = tuple(_core.score_streams())

Page = _core.Page
Block = _core.Block
SlotMeta = _core.SlotMeta


@dataclass(frozen=True)
class ModelProfile:
    """The KV shape of a model: what one token's cache is, per layer."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str = "f16"  # the worker's compute dtype: f32, f16 or bf16
    model_id: str = ""


@dataclass(frozen=True)
class SessionInfo:
    """What the daemon granted at open (formats after the agent's floors)."""

    session_id: int
    num_layers: int
    block_tokens: int
    lease_ms: int
    key_format: str
    value_format: str
    key_page_bytes: int
    value_page_bytes: int
    #: The score streams the agent's policy reads (names of SCORE_STREAMS):
    #: measure and report these (:meth:`Session.report`), as of the last sync.
    wanted_streams: frozenset
    #: Report slot streams per layer (the policy keeps each layer's slots apart).
    wants_per_layer: bool
    #: Per token a step writes, multiply the attention mass not yet reported
    #: by this (the policy's ``h2o.decay``; 1.0: sum it undecayed).
    attention_decay: float

    @classmethod
    def _from(cls, d: dict) -> "SessionInfo":
        d = dict(d, wanted_streams=frozenset(d["wanted_streams"]))
        return cls(**{f.name: d[f.name] for f in fields(cls)})


class Session:
    """An open session. Closing it (or leaving its ``with``) frees its pages.

    Pages from :meth:`page` are valid until a :meth:`sync` that returns True
    (the daemon then frees the old table's pages once acknowledged).
    Not thread-safe: use one session from one thread at a time.
    """

    def __init__(self, native: _core.Session, client: "Client"):
        self._s = native
        self._client = client  # the connection outlives its sessions
        self.info = SessionInfo._from(native.info)

    def reserve(self, num_tokens: int) -> list[Block]:
        """Pages for ``num_tokens`` more tokens; returns the new blocks."""
        return self._s.reserve(num_tokens)

    def commit(self, committed_tokens: int) -> None:
        """The first ``committed_tokens`` slots hold tokens (batch it)."""
        self._s.commit(committed_tokens)

    def sync(self) -> bool:
        """Adopts and acknowledges a new block table; True when it changed.

        After a move to another polykvd it attaches there and returns True:
        the same slots in new pages (see :attr:`moves`)."""
        return self._s.sync()

    def idle(self) -> None:
        """Promises no page access until the next :meth:`sync`, which must be
        the next call: the daemon may move the session meanwhile
        (``polykvctl move``) and that sync follows it."""
        self._s.idle()

    @property
    def moves(self) -> int:
        """How many times :meth:`sync` followed the session to another polykvd."""
        return self._s.moves

    def release(self, keep_tokens: int) -> None:
        """Gives back the pages beyond the first ``keep_tokens`` slots."""
        self._s.release(keep_tokens)

    def share_prefix(self, token_ids: Sequence[int]) -> int:
        """Offers the session's leading full blocks, which hold ``token_ids``
        (its first tokens, committed, not compacted), to later sessions of the
        same tenant and model; returns how many leading tokens are shared now.
        docs/prefix-sharing.md."""
        return self._s.share_prefix(list(token_ids))

    def attach_prefix(self, token_ids: Sequence[int]) -> int:
        """On a fresh session (before :meth:`reserve`): takes the shared blocks
        holding the leading full blocks of ``token_ids``; returns how many
        tokens that is (committed, in :attr:`blocks`; 0 when none matched)."""
        return self._s.attach_prefix(list(token_ids))

    def close(self) -> None:
        self._s.close()

    def page(self, block: int, page: int) -> np.ndarray:
        """Block ``block``'s page ``page`` (2*layer keys, 2*layer+1 values) as a
        writable uint8 array over the pool's memory: no copy. Layout:
        docs/formats.md. ``torch.from_numpy`` wraps it without a copy too."""
        return self._s.page_array(block, page)

    @property
    def blocks(self) -> list[Block]:
        return self._s.blocks

    @property
    def reserved_tokens(self) -> int:
        return self._s.reserved_tokens

    @property
    def committed_tokens(self) -> int:
        return self._s.committed_tokens

    @property
    def epoch(self) -> int:
        return self._s.epoch

    @property
    def slot_positions(self) -> list[int]:
        """After a changed sync: each slot's logical position (RoPE position)."""
        return self._s.slot_positions

    @property
    def slot_counts(self) -> list[int]:
        """After a changed sync: tokens each slot stands for (> 1 when merged)."""
        return self._s.slot_counts

    def report_slots(self, first_slot: int, meta: Sequence[SlotMeta],
                     current_turn: int = 0) -> None:
        """Metadata of slots [first_slot, +len(meta)); ``current_turn``: the
        turn being decoded (0 keeps the daemon's)."""
        self._s.report_slots(first_slot, list(meta), current_turn)

    def report(self, stream: str, first_slot: int, values, per_layer: bool = False) -> None:
        """One score stream's values (``stream`` one of :data:`SCORE_STREAMS`):
        a slot stream's for slots [first_slot, +len(values)), or
        [num_layers x n] layer-major with ``per_layer``; entropy's one per
        layer. A value out of the stream's range or a size that does not fit
        is :class:`polykv.errors.InvalidArgument`, and nothing is recorded."""
        self._s.report(stream, first_slot, _floats(values), per_layer)

    @property
    def token(self) -> bytes:
        """The session's capability token (secret; for tests of token checks)."""
        return self._s.token

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Client:
    """A connection to polykvd. Raises :class:`polykv.errors.Unavailable` when no
    daemon answers within ``timeout_ms``."""

    def __init__(self, socket: Optional[str] = None, timeout_ms: int = 5000):
        self.socket = socket or default_socket()
        self._c = _core.Client.connect(self.socket, timeout_ms)

    def open_session(self, agent_id: str, profile: ModelProfile, *, tenant: str = "default",
                     key_format: Optional[str] = None, value_format: Optional[str] = None,
                     block_tokens: int = 0, lease_ms: int = 0,
                     heartbeat: bool = True) -> Session:
        """Opens a session (maps its arenas). Formats None: the daemon's choice
        (the agent's QoS, else the profile's dtype); 0: the daemon's default."""
        native = self._c.open_session(
            agent_id, tenant, profile.num_layers, profile.num_kv_heads, profile.head_dim,
            profile.dtype, profile.model_id, key_format, value_format, block_tokens, lease_ms,
            heartbeat)
        return Session(native, self)

    def close(self) -> None:
        self._c = None

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _floats(values) -> np.ndarray:
    return np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
