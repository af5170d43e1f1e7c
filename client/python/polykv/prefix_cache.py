"""The prefix cache without a session, for an engine's connector.

An engine that computes KV in its own memory looks up, reads and stores whole
blocks of a tenant's shared prefixes by their token ids; a worker session of
the same space attaches what it stored (docs/prefix-sharing.md)::

    space = polykv.PrefixSpace("team-a", profile, block_tokens=16)
    with polykv.PrefixCache() as cache:
        hit = cache.lookup(space, token_ids)            # leading tokens held
        first, n, pages = cache.read(space, token_ids)  # their pages, as bytes
        cache.store(space, token_ids, first_block, pages)

Pages go block by block, K then V of each layer, each the format's page
bytes; a store call is at most 1 MiB (store long prefixes in order, by
``first_block``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from . import _core
from .client import ModelProfile, default_socket


@dataclass(frozen=True)
class PrefixSpace:
    """Where blocks are interchangeable: the tenant, the model, the page
    formats (None: the profile's dtype) and the block size."""

    tenant: str
    profile: ModelProfile
    key_format: Optional[str] = None
    value_format: Optional[str] = None
    block_tokens: int = 16

    def _native(self) -> _core.PrefixSpace:
        p = self.profile
        return _core.prefix_space(self.tenant, p.num_layers, p.num_kv_heads, p.head_dim, p.dtype,
                                  p.model_id, self.key_format, self.value_format,
                                  self.block_tokens)


class PrefixCache:
    """A connection to polykvd's PrefixCache service."""

    def __init__(self, socket: Optional[str] = None, timeout_ms: int = 5000):
        self.socket = socket or default_socket()
        self._c = _core.PrefixCache.connect(self.socket, timeout_ms)

    def lookup(self, space: PrefixSpace, token_ids: Sequence[int]) -> int:
        """How many leading tokens of ``token_ids`` the tenant's blocks hold."""
        return self._c.lookup(space._native(), list(token_ids))

    def read(self, space: PrefixSpace, token_ids: Sequence[int], first_block: int = 0,
             max_blocks: int = 64) -> tuple[int, int, list[bytes]]:
        """(first_block, blocks read, their pages) from ``first_block`` on."""
        return self._c.read(space._native(), list(token_ids), first_block, max_blocks)

    def store(self, space: PrefixSpace, token_ids: Sequence[int], first_block: int,
              pages: Sequence[bytes]) -> int:
        """Stores blocks ``first_block``, ... from ``pages``; returns the
        leading blocks of the chain held now."""
        return self._c.store(space._native(), list(token_ids), first_block, list(pages))

    def close(self) -> None:
        self._c = None

    def __enter__(self) -> "PrefixCache":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
