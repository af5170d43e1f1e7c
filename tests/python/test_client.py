"""polykv.Client / Session / Admin against a real polykvd: pages are the
pool's memory (zero-copy), errors are the daemon's, with its message, and a
refused call changes nothing."""

from __future__ import annotations

import dataclasses
import gc

import numpy as np
import pytest
import torch

import polykv
from polykv import errors

from conftest import pool_problems, start_daemon

PROFILE = polykv.ModelProfile(num_layers=2, num_kv_heads=2, head_dim=64, dtype="f32")


def session_state(daemon, agent_id):
    """The agent's sessions as the daemon sees them, but for their idle time."""
    sessions = daemon.admin.sessions(agent_id=agent_id)
    return [dataclasses.replace(s, idle_seconds=0) for s in sessions]


def test_session_pages_are_the_pools_memory(daemon):
    with polykv.Client(daemon.socket) as client:
        with client.open_session("pages", PROFILE, tenant="t-pages", key_format="f32",
                                 value_format="int8", block_tokens=16) as s:
            assert (s.info.key_format, s.info.value_format) == ("f32", "int8")
            assert s.info.block_tokens == 16
            blocks = s.reserve(40)
            assert len(blocks) == 3 and s.reserved_tokens == 48
            page = blocks[1].pages[2]  # layer 1's keys
            assert (page.layer, page.is_value, page.format) == (1, False, "f32")
            assert page.size_bytes == s.info.key_page_bytes
            a, b = s.page(1, 2), s.page(1, 2)
            assert a.size == page.size_bytes and a.dtype == np.uint8
            a[:] = np.arange(a.size, dtype=np.uint64).astype(np.uint8)
            # Two views of one page: the same bytes, no copy in between.
            assert np.array_equal(a, b)
            assert a.ctypes.data == b.ctypes.data
            assert s.page(1, 3).ctypes.data != a.ctypes.data
            # torch takes the page through DLPack, also without a copy.
            t = torch.from_dlpack(a)
            t[:3] = torch.tensor([7, 8, 9], dtype=torch.uint8)
            assert list(b[:3]) == [7, 8, 9] and t.data_ptr() == a.ctypes.data
            s.commit(40)
            [info] = daemon.admin.sessions(agent_id="pages")
            assert (info.committed_tokens, info.reserved_tokens) == (40, 48)
            assert info.bytes == 3 * 2 * (s.info.key_page_bytes + s.info.value_page_bytes)
    assert pool_problems(daemon.admin) == ""


def test_a_page_view_keeps_its_session_mapped(daemon):
    client = polykv.Client(daemon.socket)
    s = client.open_session("views", PROFILE, tenant="t-views")
    s.reserve(16)
    view = s.page(0, 0)
    view[:4] = [1, 2, 3, 4]
    del s, client
    gc.collect()
    # The session object lives while the view does: reading is safe.
    assert list(view[:4]) == [1, 2, 3, 4]
    assert len(daemon.admin.sessions(agent_id="views")) == 1
    del view
    gc.collect()
    assert daemon.admin.sessions(agent_id="views") == []


def test_errors_carry_the_code_and_the_daemons_message(daemon):
    with pytest.raises(errors.Unavailable, match="cannot reach polykvd"):
        polykv.Client(daemon.socket + ".nothing", timeout_ms=200)
    with polykv.Client(daemon.socket) as client:
        with pytest.raises(errors.InvalidArgument, match="not a page format"):
            client.open_session("e", PROFILE, key_format="int3")
        with pytest.raises(errors.InvalidArgument, match="compute dtype"):
            client.open_session("e", polykv.ModelProfile(2, 2, 64, dtype="int8"))
        with pytest.raises(errors.InvalidArgument):
            client.open_session("e", polykv.ModelProfile(0, 2, 64))
        with client.open_session("e", PROFILE, tenant="t-errors") as s:
            s.reserve(16)
            s.commit(10)
            before = session_state(daemon, "e")
            too_many = s.reserved_tokens + 1
            with pytest.raises(errors.Error) as e:
                s.commit(too_many)
            assert e.value.code in ("INVALID_ARGUMENT", "OUT_OF_RANGE", "FAILED_PRECONDITION")
            assert str(too_many) in e.value.message
            with pytest.raises(errors.InvalidArgument, match="not all committed"):
                s.report("importance", 0, np.ones(12))
            with pytest.raises(errors.OutOfRange):
                s.page(5, 0)
            # A refused call changes nothing.
            assert session_state(daemon, "e") == before
            # Every stream, through the one report call.
            assert polykv.SCORE_STREAMS == ("attention", "intent", "importance", "observation",
                                            "entropy")
            s.report("importance", 0, np.ones(10))
            s.report("intent", 0, np.linspace(-1, 1, 10))
            s.report("observation", 0, np.ones(10))
            s.report("attention", 0, np.ones(10))
            s.report("importance", 0, np.ones(2 * 10), per_layer=True)
            s.report("entropy", 0, [1.5, 2.5])  # one per layer
            s.report_slots(0, [polykv.SlotMeta()] * 10, current_turn=1)
            with pytest.raises(errors.InvalidArgument):
                s.report("importance", 0, np.ones(2 * 10 + 1), per_layer=True)  # [layers x n]
            with pytest.raises(errors.InvalidArgument, match="one per layer"):
                s.report("entropy", 0, [1.5])
            with pytest.raises(errors.InvalidArgument, match=">= 0"):
                s.report("attention", 0, [-1.0])
            with pytest.raises(errors.InvalidArgument, match="unknown"):
                s.report("loudness", 0, [1.0])
            with pytest.raises(errors.InvalidArgument, match="role"):
                polykv.SlotMeta().role = "narrator"
        with pytest.raises(errors.Error):
            s.reserve(16)  # closed
    assert issubclass(errors.ResourceExhausted, polykv.Error)
    assert pool_problems(daemon.admin) == ""


def test_an_idle_session_takes_nothing_but_sync(daemon):
    with polykv.Client(daemon.socket) as client:
        with client.open_session("idle", PROFILE, tenant="t-idle") as s:
            s.reserve(16)
            s.commit(10)
            s.idle()
            with pytest.raises(errors.FailedPrecondition, match="idle"):
                s.reserve(16)
            assert s.sync() is False  # nothing moved it
            assert s.moves == 0
            s.reserve(16)
            # This daemon has no peer TLS: it moves nothing, and says why.
            with pytest.raises(errors.FailedPrecondition, match="peer.cert"):
                daemon.admin.move(s.info.session_id, "127.0.0.1:1", wait_ms=100)
    assert pool_problems(daemon.admin) == ""


def test_admin_qos_stats_sessions_and_evict(daemon):
    admin = daemon.admin
    stored = admin.set_qos(polykv.Qos(agent_id="qos-a", priority="high", policy="h2o",
                                      budget_tokens=128, key_format="int8",
                                      key_precision_floor="int4", max_bytes=1 << 24))
    assert (stored.priority, stored.policy, stored.budget_tokens) == ("high", "h2o", 128)
    assert (stored.key_format, stored.key_precision_floor) == ("int8", "int4")
    assert admin.get_qos("qos-a") == stored
    with pytest.raises(ValueError, match="not a page format"):
        admin.set_qos(polykv.Qos(agent_id="qos-a", key_format="q4"))
    with pytest.raises(errors.InvalidArgument):
        admin.set_qos(polykv.Qos(agent_id="qos-a", policy="no-such-policy"))
    assert admin.get_qos("qos-a") == stored  # the refused record changed nothing

    with polykv.Client(daemon.socket) as client:
        s = client.open_session("qos-a", PROFILE, tenant="t-qos")
        assert s.info.key_format == "int8"  # the QoS's format, as the daemon granted it
        assert (s.info.wanted_streams, s.info.wants_per_layer) == ({"attention"}, False)  # h2o
        assert s.info.attention_decay == 1.0  # h2o.decay unset: summed
        s.reserve(32)
        stats = admin.stats()
        assert stats.num_sessions == 1 and stats.pool.used_bytes > 0
        assert [t.num_sessions for t in stats.tenants if t.tenant.startswith("t-qos")] == [1]
        [info] = admin.sessions(tenant="t-qos")
        assert (info.agent_id, info.priority, info.profile.dtype) == ("qos-a", "high", "f32")
        assert admin.evict(info.session_id) > 0
        assert admin.sessions(tenant="t-qos") == []
        with pytest.raises(errors.Error):
            s.reserve(16)
    with pytest.raises(errors.NotFound):
        admin.evict(info.session_id)
    assert pool_problems(admin) == ""


def test_the_evaluation_names_page_formats_as_the_library_does():
    # bench/eval/live.py keeps its own tuple (stdlib only, no polykv import);
    # this holds it to the kernels' table, which polykv.PAGE_FORMATS reads.
    import sys
    from conftest import ROOT
    sys.path.insert(0, str(ROOT / "bench" / "eval"))
    import live
    assert live.PAGE_FORMATS == polykv.PAGE_FORMATS


def test_a_later_session_of_the_tenant_attaches_a_shared_prefix(tmp_path):
    daemon = start_daemon(tmp_path)  # its own: the shared blocks stay cached after the test
    try:
        ids = list(range(1000, 1040))
        opts = dict(key_format="f32", value_format="f32", block_tokens=16)
        with polykv.Client(daemon.socket) as client:
            with client.open_session("sharer", PROFILE, tenant="t-prefix", **opts) as a:
                a.reserve(40)
                for b in range(3):
                    for p in range(4):
                        a.page(b, p)[:] = 16 * b + p + 1
                a.commit(40)
                assert a.share_prefix(ids) == 32  # the full blocks
                with client.open_session("reader", PROFILE, tenant="t-prefix", **opts) as r:
                    assert r.attach_prefix(ids + [7]) == 32
                    assert (r.committed_tokens, len(r.blocks)) == (32, 2)
                    assert r.blocks[1].pages[3].page_id == a.blocks[1].pages[3].page_id
                    assert np.array_equal(r.page(1, 3), a.page(1, 3))
                    assert r.page(1, 3)[0] == 16 + 3 + 1
                    with pytest.raises(errors.FailedPrecondition):
                        r.release(20)  # would cut into a shared block
                    with pytest.raises(errors.FailedPrecondition):
                        a.attach_prefix(ids)  # not a fresh session
                with client.open_session("stranger", PROFILE, tenant="t-other", **opts) as c:
                    assert c.attach_prefix(ids) == 0
        # Nobody holds them now: cached, the pool's only pages.
        stats = daemon.admin.stats()
        assert stats.num_sessions == 0
        assert stats.pool.used_bytes == 2 * 4 * 16 * 2 * 64 * 4  # 2 blocks of 4 f32 pages
    finally:
        daemon.admin.close()
        daemon.process.terminate()
        daemon.process.wait(timeout=20)


def test_a_connectors_stored_blocks_are_attached_by_a_session(tmp_path):
    daemon = start_daemon(tmp_path)  # its own: the stored blocks stay cached after the test
    try:
        ids = list(range(2000, 2032))
        space = polykv.PrefixSpace("t-conn", PROFILE, block_tokens=16)  # f32 pages, the dtype's
        page_bytes = 16 * 2 * 64 * 4
        pages = [bytes([(7 * p + k) % 251 for k in range(page_bytes)]) for p in range(8)]
        with polykv.PrefixCache(daemon.socket) as cache:
            assert cache.lookup(space, ids) == 0
            assert cache.store(space, ids, 0, pages[:4]) == 1  # block 0, then block 1
            assert cache.store(space, ids, 1, pages[4:]) == 2
            assert cache.lookup(space, ids + [1, 2]) == 32
            assert cache.read(space, ids, 1) == (1, 1, pages[4:])
            with pytest.raises(errors.InvalidArgument):
                cache.store(space, ids, 0, [pages[0][:-1]] + pages[1:4])
            with pytest.raises(errors.FailedPrecondition):
                cache.store(space, list(range(48)), 2, pages[:4])  # blocks 0 and 1 first
            other = polykv.PrefixSpace("t-other", PROFILE, block_tokens=16)
            assert cache.lookup(other, ids) == 0
        with polykv.Client(daemon.socket) as client:
            with client.open_session("engine-peer", PROFILE, tenant="t-conn", key_format="f32",
                                     value_format="f32", block_tokens=16) as s:
                assert s.attach_prefix(ids) == 32
                for b in range(2):
                    for p in range(4):
                        assert s.page(b, p).tobytes() == pages[4 * b + p]
        assert daemon.admin.stats().pool.used_bytes == 2 * 4 * page_bytes  # cached, all of it
    finally:
        daemon.admin.close()
        daemon.process.terminate()
        daemon.process.wait(timeout=20)
