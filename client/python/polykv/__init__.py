"""polykv: the KV cache of LLM agents in a shared daemon (polykvd).

- :class:`Client` / :class:`Session`: open a session, reserve pages, write
  keys and values in place, commit, sync (polykv.client).
- :class:`Admin`: pool stats, sessions, per-agent QoS (polykv.admin).
- :class:`PrefixCache`: a tenant's shared prefix blocks without a session,
  for an engine's connector (polykv.prefix_cache).
- :mod:`polykv.hf`: Hugging Face transformers with its KV cache in polykvd
  (needs torch and transformers: ``pip install polykv[hf]``).
- :mod:`polykv.errors`: one exception class per status code.

Docs: docs/python.md.
"""

from .admin import Admin, PoolStats, Qos, SessionStatus, Stats, TenantStats
from .client import (DEFAULT_SOCKET, PAGE_FORMATS, SCORE_STREAMS, Block, Client, ModelProfile,
                     Page, Session, SessionInfo, SlotMeta, default_socket)
from .errors import Error
from .prefix_cache import PrefixCache, PrefixSpace

__all__ = [
    "Admin", "Block", "Client", "DEFAULT_SOCKET", "Error", "ModelProfile", "PAGE_FORMATS",
    "Page", "PoolStats", "PrefixCache", "PrefixSpace", "Qos", "SCORE_STREAMS", "Session",
    "SessionInfo", "SessionStatus", "SlotMeta", "Stats", "TenantStats", "default_socket",
]
