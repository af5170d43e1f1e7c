"""Two Python processes in two tenants on one daemon see nothing of each
other, and a Python process killed mid-step leaks nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import polykv
from polykv import errors

from conftest import model_file, pool_problems, wait_until

CHILD = [sys.executable, str(Path(__file__).with_name("child.py"))]
MARKER = 0xA5


def test_two_tenants_cannot_see_each_others_pages(daemon):
    holder = subprocess.Popen(CHILD + ["hold", daemon.socket, "tenant-a", str(MARKER)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        a = json.loads(holder.stdout.readline())
        profile = polykv.ModelProfile(num_layers=2, num_kv_heads=2, head_dim=64, dtype="f32")
        with polykv.Client(daemon.socket) as client, \
                client.open_session("reader", profile, tenant="tenant-b") as b:
            b.reserve(256)
            mine = {page.arena_id for block in b.blocks for page in block.pages}
            assert mine.isdisjoint(a["arenas"]), "two tenants share an arena"
            for arena in a["arenas"]:
                # With b's own credentials: another tenant's arena is not handed out.
                with pytest.raises((errors.PermissionDenied, errors.NotFound)):
                    polykv._core.fetch_arena_fd(daemon.fd_socket, b.info.session_id, b.token,
                                                arena)
                # With a's session id but b's token: refused too.
                with pytest.raises(errors.PermissionDenied):
                    polykv._core.fetch_arena_fd(daemon.fd_socket, a["session_id"], b.token,
                                                arena)
            for i, block in enumerate(b.blocks):
                for p in range(len(block.pages)):
                    assert not np.any(b.page(i, p) == MARKER), "a's bytes in b's page"
        tenants = {t.tenant.split("@")[0] for t in daemon.admin.stats().tenants}
        assert "tenant-a" in tenants
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    assert wait_until(lambda: pool_problems(daemon.admin) == "")


def test_a_python_process_killed_mid_step_leaks_nothing(daemon):
    model = model_file("smollm2")
    child = subprocess.Popen(CHILD + ["generate", daemon.socket, "crash", str(model)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "generating"
        before = daemon.admin.sessions(agent_id="crasher")[0].committed_tokens
        # Killed while it decodes: let it get some steps further first.
        assert wait_until(lambda: daemon.admin.sessions(agent_id="crasher")[0]
                          .committed_tokens > before)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait(timeout=30)
    assert wait_until(lambda: pool_problems(daemon.admin) == ""), pool_problems(daemon.admin)
