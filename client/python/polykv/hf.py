"""Hugging Face transformers with its KV cache in polykvd.

    import polykv.hf
    model = AutoModelForCausalLM.from_pretrained(..., attn_implementation="polykv",
                                                 dtype=torch.float32)
    cache = polykv.hf.PolykvCache(model.config, agent_id="coder-1", tenant="team-a")
    polykv.hf.prefill(model, cache, input_ids[:, :-1], tokenizer=tok)
    out = model.generate(input_ids, past_key_values=cache, max_new_tokens=64)

The cache's keys and values are pages of a polykvd session, in the formats
the daemon grants (the agent's QoS). It is the reference worker's paged KV
store (client/worker/paged_kv_store.h) driven from Python: new tokens' rows
are written into the pool's pages, attention runs polykv's paged kernels
directly over them (no dense copy of the cache), the attention mass goes to
the daemon's policies, and at step boundaries the store adopts the daemon's
compactions. A session is therefore compressed exactly as a worker's is.

Positions are logical: ``get_seq_length()`` counts every token the model has
seen, evicted ones included, so RoPE positions stay right after the daemon
drops slots. One sequence (batch size 1), no padding; CPU tensors. The
model's attention must be plain causal softmax attention with scale
1/sqrt(head_dim) (Llama, Qwen2, SmolLM2, ...), no sliding window.
"""

from __future__ import annotations

import contextlib
import math
import threading
import weakref
from typing import Iterator, Optional

import numpy as np
import torch
from transformers import AttentionInterface
from transformers.cache_utils import Cache, CacheLayerMixin
from transformers.masking_utils import AttentionMaskInterface

from . import _core
from .client import default_socket

#: The ``attn_implementation`` name the attention function is registered as.
ATTN_IMPLEMENTATION = "polykv"

#: KVzip's context-reconstruction prompt, as the reference worker asks it
#: (client/worker/conversation.cc).
REPEAT_PROMPT = "\n\nRepeat the previous context exactly.\n"

# The cache whose forward step is in flight on this thread: transformers calls
# Cache.update and then the attention function of the same layer, and the
# latter has no other way to the cache.
_in_flight = threading.local()


class PolykvLayer(CacheLayerMixin):
    """One layer's view of the session (all layers share one store)."""

    is_sliding = False
    is_compileable = False

    def __init__(self, cache: "PolykvCache", layer: int):
        super().__init__()
        self._cache = weakref.proxy(cache)  # no cycle: the session closes with its cache
        self._layer = layer

    def lazy_initialization(self, key_states, value_states) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states, value_states, cache_kwargs=None):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        return self._cache._append(self._layer, key_states, value_states, cache_kwargs)

    def get_mask_sizes(self, cache_position):
        return self._cache.num_slots + cache_position.shape[0], 0

    def get_seq_length(self) -> int:
        return self._cache.seen_tokens

    def get_max_cache_shape(self) -> int:
        return -1

    def reset(self) -> None:
        raise NotImplementedError("a polykv cache is not reset: close it and open another")

    def reorder_cache(self, beam_idx) -> None:
        raise NotImplementedError("polykv caches hold one sequence: no beam search")


class PolykvCache(Cache):
    """A transformers ``Cache`` whose keys and values live in polykvd.

    Args:
        config: the model's config (its text config gives the KV shape).
        agent_id, tenant: the session's agent (QoS is per agent) and tenant.
        socket: polykvd's socket (default: ``polykv.default_socket()``).
        key_format, value_format: page formats to ask for (None: the agent's
            QoS decides; the daemon raises them to the agent's floors).
        block_tokens: tokens per page (0: the daemon's or the QoS's).
        recent_f16_tokens: attend the newest N tokens from f16 copies kept in
            this process (KIVI's residual), as the worker's
            ``--recent-f16-tokens``.
        threads: CPU threads of the attention kernels (0: all).
        reserve_retry_ms: how long a refused reservation is retried (the pool
            under pressure) before ResourceExhausted is raised.
    """

    def __init__(self, config, *, agent_id: str, tenant: str = "default",
                 socket: Optional[str] = None, key_format: Optional[str] = None,
                 value_format: Optional[str] = None, block_tokens: int = 0,
                 recent_f16_tokens: int = 0, threads: int = 0,
                 reserve_retry_ms: int = 30000):
        text = config.get_text_config()
        layer_types = getattr(text, "layer_types", None) or []
        if getattr(text, "use_sliding_window", False) or \
                any(t != "full_attention" for t in layer_types):
            raise ValueError("polykv caches hold full-attention layers only (no sliding window)")
        self.num_layers = text.num_hidden_layers
        self.num_kv_heads = text.num_key_value_heads
        self.head_dim = getattr(text, "head_dim", None) or \
            text.hidden_size // text.num_attention_heads
        self._store = _core.KvStore(
            socket or default_socket(), agent_id, tenant, getattr(text, "name_or_path", "") or "",
            self.num_layers, self.num_kv_heads, self.head_dim, key_format, value_format,
            block_tokens, recent_f16_tokens, threads, reserve_retry_ms)
        self.seen_tokens = 0  # logical positions used so far (evicted tokens included)
        self._turn = -1
        self._role = "user"
        self._probing = False
        self._step_end = 0  # the step's last position + 1
        super().__init__(layers=[PolykvLayer(self, i) for i in range(self.num_layers)])

    def close(self) -> None:
        """Closes the session: its pages go back to the pool. Also when the
        cache is garbage-collected or leaves its ``with``."""
        self._store.close()

    def __enter__(self) -> "PolykvCache":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- what the daemon and the store say ---
    @property
    def num_slots(self) -> int:
        """Slots attention reads (fewer than seen_tokens once the daemon evicted)."""
        return self._store.num_slots

    @property
    def epoch(self) -> int:
        """Compactions adopted so far (the block table's epoch)."""
        return self._store.epoch

    @property
    def bytes(self) -> int:
        """Bytes of pages (and f16 recent rows) this cache holds."""
        return self._store.bytes

    @property
    def peak_bytes(self) -> int:
        return self._store.peak_bytes

    def supports_probe(self, kind: str) -> bool:
        """Whether the agent's policy reads this probe kind's scores:
        "reconstruct" (kvzip), "observation" (snapkv), "intent"."""
        return self._store.supports_probe(kind)

    # --- conversation structure ---
    def begin_turn(self, role: str, intent: str = "") -> None:
        """A new message starts: its tokens carry the next turn index and
        ``role`` (system, user, assistant, tool_call, tool_output, error).
        Commits and syncs with the daemon first, as the worker does."""
        turn = self._turn + 1
        self._store.begin_turn(turn, role, intent)  # a bad role raises here, nothing changed
        self._turn, self._role = turn, role

    def commit(self) -> None:
        """Commits the tokens written since the last commit now (the store
        commits every few steps and at each begin_turn on its own)."""
        self._store.commit_pending()

    @contextlib.contextmanager
    def probe(self, kind: str) -> Iterator[None]:
        """Forward passes inside are a probe: they attend over the cache but are
        not kept; at the end the attention they paid each slot is reported
        as ``kind`` says. Positions do not advance."""
        self._store.begin_probe(kind)
        self._probing = True
        seen = self.seen_tokens
        try:
            yield
        finally:
            self._probing = False
            self.seen_tokens = seen
            self._store.end_probe()

    # --- the forward step (called by transformers) ---
    def _append(self, layer: int, key_states, value_states, cache_kwargs):
        if key_states.shape[0] != 1:
            raise ValueError("polykv caches hold one sequence (batch size 1)")
        n = key_states.shape[2]
        if layer == 0:
            positions = cache_kwargs.get("cache_position") if cache_kwargs else None
            if positions is None:
                positions = torch.arange(self.seen_tokens, self.seen_tokens + n)
            pos = positions.to(torch.int32).cpu().numpy()
            self._store.begin_step(np.zeros(n, np.int32), np.ascontiguousarray(pos),
                                   max(self._turn, 0), self._role)
            self._step_end = int(pos[-1]) + 1
            _in_flight.cache = self
        self._store.append(layer, _rows(key_states), _rows(value_states))
        return key_states, value_states

    def _attend(self, layer: int, query):
        q = _rows(query)
        out = torch.empty_like(q)
        self._store.attend(layer, q, out)
        if layer == self.num_layers - 1:
            _in_flight.cache = None
            self._store.end_step()
            if not self._probing:
                self.seen_tokens = max(self.seen_tokens, self._step_end)
        return out


def _rows(states: torch.Tensor) -> torch.Tensor:
    """[1, heads, n, head_dim] -> contiguous f32 [n, heads, head_dim]."""
    return states[0].transpose(0, 1).to(torch.float32).contiguous()


def polykv_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                     sliding_window=None, **kwargs):
    """transformers' attention interface over the polykv cache: the queries
    attend to every slot of the session (and, causally, the step's own
    tokens) in the pages' own formats. Returns ([1, n, heads, head_dim], None)."""
    cache = getattr(_in_flight, "cache", None)
    if cache is None:
        raise RuntimeError('attn_implementation="polykv" needs past_key_values=PolykvCache(...)')
    if sliding_window is not None:
        raise ValueError("polykv attention has no sliding window")
    head_dim = query.shape[-1]
    if scaling is not None and not math.isclose(scaling, head_dim ** -0.5, rel_tol=1e-6):
        raise ValueError(f"polykv attention scales by 1/sqrt(head_dim); the model asks {scaling}")
    if dropout:
        raise ValueError("polykv attention is for inference (dropout 0)")
    out = cache._attend(module.layer_idx, query)
    return out.to(query.dtype).unsqueeze(0), None


def _causal_only(batch_size, cache_position, kv_length, kv_offset=0, mask_function=None,
                 attention_mask=None, **kwargs):
    """The mask function of "polykv": none, the kernels are causal. Padding
    (a 2-D mask with zeros) cannot be expressed: refused."""
    if attention_mask is not None and not bool(attention_mask.all()):
        raise ValueError("polykv attention takes one unpadded sequence (no zeros in the mask)")
    return None


AttentionInterface.register(ATTN_IMPLEMENTATION, polykv_attention)
AttentionMaskInterface.register(ATTN_IMPLEMENTATION, _causal_only)


@torch.no_grad()
def prefill(model, cache: PolykvCache, input_ids: torch.Tensor, *, chunk: int = 64,
            tokenizer=None) -> torch.Tensor:
    """Runs ``input_ids`` ([1, n], after what the cache holds) through the model
    in chunks of ``chunk`` tokens, as the worker prefills, and returns the
    last logits. Where the agent's policy ranks by KVzip's importance
    (``cache.supports_probe("reconstruct")``) each chunk is followed by the
    worker's reconstruction probe (REPEAT_PROMPT, then the chunk again), which
    needs ``tokenizer`` (ValueError without one). Tokens no probe scored rank
    with the most important, so a kvzip session prefilled without probes
    (e.g. by ``generate`` alone) is compacted by recency instead."""
    probe = cache.supports_probe("reconstruct")
    if probe and tokenizer is None:
        raise ValueError("the agent's policy ranks by reconstruction probes (kvzip): "
                         "pass tokenizer= so that prefill can run them")
    repeat = tokenizer(REPEAT_PROMPT, add_special_tokens=False, return_tensors="pt").input_ids \
        if probe else None
    logits = None
    for i in range(0, input_ids.shape[1], chunk):
        part = input_ids[:, i:i + chunk]
        logits = model(part, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1]
        if probe:
            with cache.probe("reconstruct"):
                model(torch.cat([repeat, part], dim=1), past_key_values=cache, use_cache=True,
                      logits_to_keep=1)
    return logits
