"""Fixtures of the Python package's tests: a real polykvd per test module
(POLYKV_BIN_DIR, default build/bin) and the worker's model files
(POLYKV_MODEL_DIR, default ~/.cache/polykv/models). A missing input skips
outside CI and fails under it (tests/eval/missing_input.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

import polykv

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "eval"))
from missing_input import missing_input  # noqa: E402

BIN_DIR = Path(os.environ.get("POLYKV_BIN_DIR", ROOT / "build" / "bin"))
MODEL_DIR = Path(os.environ.get("POLYKV_MODEL_DIR",
                                Path.home() / ".cache" / "polykv" / "models"))
MODELS = {
    "smollm2": ("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m"),
    "qwen": ("Qwen2.5-Coder-0.5B-Instruct.gguf", "qwen2.5-coder-0.5b"),
}


@dataclass
class Daemon:
    socket: str
    admin: polykv.Admin
    process: subprocess.Popen

    @property
    def fd_socket(self) -> str:
        return self.socket + ".fds"


def start_daemon(folder: Path, pool_bytes: str = "256MiB") -> Daemon:
    polykvd = BIN_DIR / "polykvd"
    if not polykvd.exists():
        missing_input(f"{polykvd} (build it: scripts/build.sh)")
    sock = str(folder / "polykvd.sock")
    log = open(folder / "polykvd.log", "w")
    proc = subprocess.Popen(
        [str(polykvd), "--socket", sock, "--metrics-address", "off", "--pool-bytes", pool_bytes,
         "--arena-bytes", "16MiB", "--lease-ms", "1500", "--log-level", "warn"],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        admin = polykv.Admin(sock, timeout_ms=20000)
    except polykv.Error:
        proc.kill()
        raise
    return Daemon(sock, admin, proc)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    d = start_daemon(tmp_path_factory.mktemp("polykvd"))
    yield d
    d.admin.close()
    d.process.terminate()
    d.process.wait(timeout=20)


def pool_problems(admin: polykv.Admin) -> str:
    """What is left in the pool that should not be: "" when it is empty."""
    s = admin.stats()
    problems = []
    if s.num_sessions:
        problems.append(f"{s.num_sessions} sessions open")
    if s.pool.used_bytes:
        problems.append(f"{s.pool.used_bytes} bytes used")
    if s.pool.num_pages:
        problems.append(f"{s.pool.num_pages} pages")
    return "; ".join(problems)


def wait_until(predicate, seconds: float = 30.0, every: float = 0.1) -> bool:
    """Polls predicate until it holds; False when `seconds` passed first (the
    bound is generous: it only keeps a broken daemon from hanging the test)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(every)
    return predicate()


def model_file(name: str) -> Path:
    file, fetch_name = MODELS[name]
    path = MODEL_DIR / file
    if not path.exists():
        missing_input(f"{path} (fetch it: scripts/fetch-model.sh {fetch_name})")
    return path
