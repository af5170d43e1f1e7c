"""eval.py's run: the evaluation on the product path.

Every (task, config) runs as one `polykv-worker run TASK --daemon SOCKET`
process on one polykvd that this module starts for the run. The config
becomes the agent's QoS, set through the Admin API before the worker opens
its session (`polykvctl qos set AGENT --policy P --budget-tokens N
--key-format K --value-format V --block-tokens T`; the worker asks for no
formats or page size, only its own f16 recent window); the daemon then
compacts the session at its own trigger while the context is prefilled and
the answer decoded. Each run writes one record (the format score.py and
report.py read, "mode": "live"; the in-process harness that first wrote it
was removed on 2026-12-06); what a live run cannot measure is null, and
`live_notes` says why.

The budget: round(budget x context tokens), the context being every message
before the question, as the worker's cache holds it once the context is
prefilled: `polykv-worker run TASK --count-tokens`
renders and tokenizes the task with the same chat tokenizer and reports the
question line's position. A config with /F<n> sets the budget as the
daemon's default QoS would instead: `--budget-fraction budget --budget-tokens
n`, a share of the context as it grows, never below n tokens.

Stdlib only; eval.py imports it. The pure helpers are tested offline in
tests/eval/test_live.py, the whole path in tests/eval/live_e2e.py.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import gzip
import json
import math
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field

REFERENCE = "full@1/f16"
# The worker's turn defaults, so every config answers the same turn the same way.
DEFAULT_MAX_NEW_TOKENS = 64  # its --max-new-tokens (turns that set none)
PREFILL_CHUNK = 128          # its --prefill-chunk, unless a config's /P<n> says otherwise
MAX_PREFILL_CHUNK = 4096
# A worker far past this is stuck; its (task, config) gets an error record.
WORKER_TIMEOUT_S = 1800
TENANT = "eval"
LEASE_MS = 30000             # polykvd --lease-ms (class Daemon says why)
# The f16 recent window of formats with int2 unless /R<n> says otherwise
# (the worker's --recent-f16-tokens).
INT2_TAIL = 128
DEFAULT_BLOCK_TOKENS = 16  # /T<n> when none is named
MAX_RECENT_TOKENS = 1 << 16  # the largest /R<n>
# Agent ids: letters, digits and _.:- (daemon/pool/validation.cc), at most
# this many characters (a shorter limit than the daemon's own, to be safe).
AGENT_MAX_LEN = 100

NULL_FIELDS_NOTE = (
    "kept_slots_mean, merged_groups, bytes_context, bytes_mean and compaction_ms are null: "
    "polykvd compacts the session as it grows, out of the worker's sight (see compactions)")


class LiveError(Exception):
    """A (task, config) that cannot run live; its message goes into the record."""


# --------------------------------------------------------------------------
# Pure helpers (tests/eval/test_live.py)


@dataclass
class Config:
    text: str      # canonical, as records carry it ("h2o@0.25/K8V4")
    policy: str
    budget: float
    formats: str
    k_format: str  # the agent's QoS --key-format (kernels' short names)
    v_format: str
    f16_tail: int = 0  # the f16 recent window: the worker's --recent-f16-tokens
    block_tokens: int = DEFAULT_BLOCK_TOKENS  # the agent's QoS --block-tokens
    # /F<n> (live only): the budget is the QoS's budget_fraction, a share of
    # the context so far, with this floor in tokens; None: a fixed budget of
    # round(budget x context) tokens.
    budget_floor: int | None = None
    # /P<n> (live only): the worker's --prefill-chunk. A compacting session
    # holds its budget plus one chunk, then the chunk's KVzip probe (prompt
    # and chunk again), until the next Sync, so the chunk sets the peak above
    # the budget.
    prefill_chunk: int = PREFILL_CHUNK
    # The policy's compaction trigger as polykvd runs it (policy_trigger);
    # None until asked (then no compaction is checked for).
    trigger: float | None = None

    @property
    def full(self) -> bool:
        return self.policy == "full"

    @property
    def fractional(self) -> bool:
        return self.budget_floor is not None


# Every page format's short name, in wire order: kernels/page_format.cc's
# table (tests/eval/test_live.py checks them against it).
PAGE_FORMATS = ("f32", "f16", "bf16", "fp8", "int8", "int4", "int2")
_INT_BITS = {"8": "int8", "4": "int4", "2": "int2"}


def parse_config(text: str) -> Config:
    """policy@budget/formats[/T<n>][/R<n>][/F<n>][/P<n>]: /F<n> makes the
    budget a share of the session's context as it grows (QoS budget_fraction),
    n tokens its floor (QoS budget_tokens); /P<n> is the worker's prefill
    chunk (default PREFILL_CHUNK)."""
    def fail(why):
        raise ValueError(f'cache config "{text}": {why} (expected '
                         "policy@budget/formats[/T<n>][/R<n>][/F<n>][/P<n>], e.g. h2o@0.25/K8V4)")
    text = text.strip()
    spec, block, recent, floor, chunk = text, DEFAULT_BLOCK_TOKENS, None, None, PREFILL_CHUNK
    seen = set()
    while True:  # trailing /T<n>, /R<n>, /F<n> and /P<n>, each at most once, in any order
        slash = spec.rfind("/")
        what = spec[slash + 1:slash + 2] if slash >= 0 else ""
        if what not in ("T", "R", "F", "P"):
            break
        n = spec[slash + 2:]
        if what in seen or not n.isdigit():
            fail({"T": "T<n>: a number of tokens per page, given once",
                  "R": "R<n>: a number of recent tokens kept in f16, given once",
                  "F": "F<n>: the fractional budget's floor in tokens, given once",
                  "P": "P<n>: the worker's prefill chunk in tokens, given once"}[what])
        seen.add(what)
        if what == "F":
            floor = int(n)
        elif what == "P":
            chunk = int(n)
            if not 1 <= chunk <= MAX_PREFILL_CHUNK:
                fail(f"P<n>: the prefill chunk must be 1..{MAX_PREFILL_CHUNK} tokens")
        elif what == "T":
            block = int(n)
            if not 1 <= block <= 256 or block & (block - 1):
                fail("T<n>: tokens per page must be a power of two in 1..256")
        else:
            recent = int(n)
            if recent > MAX_RECENT_TOKENS:
                fail(f"R<n>: the f16 recent window must be 0..{MAX_RECENT_TOKENS} tokens")
        spec = spec[:slash]
    slash = spec.rfind("/")
    at = spec.find("@")
    if at <= 0 or slash < 0 or slash < at:
        fail("malformed")
    policy = spec[:at]
    try:
        budget = float(spec[at + 1:slash])
    except ValueError:
        budget = float("nan")
    if not (budget > 0) or budget > 1:
        fail("budget must be a number in (0, 1]")
    if policy == "full":
        budget = 1.0
    formats = spec[slash + 1:]
    tail = 0
    if formats in ("f32", "f16"):
        k = v = formats
    elif (len(formats) == 4 and formats[0] == "K" and formats[2] == "V"
          and formats[1] in _INT_BITS and formats[3] in _INT_BITS):
        k, v = _INT_BITS[formats[1]], _INT_BITS[formats[3]]
        if "int2" in (k, v):
            tail = INT2_TAIL
    else:
        fail("formats must be f32, f16 or K<8|4|2>V<8|4|2>")
    if recent and formats in ("f32", "f16"):
        fail("R<n> keeps recent tokens in f16 beside quantized pages: it needs K<k>V<v>")
    name = f"{policy}@{budget:g}/{formats}"
    if block != DEFAULT_BLOCK_TOKENS:
        name += f"/T{block}"
    if recent is not None and recent != tail:
        name += f"/R{recent}"
        tail = recent
    if floor is not None and policy == "full":
        fail("F<n> is a budget: the full policy has none")
    if floor is not None:
        name += f"/F{floor}"
    if chunk != PREFILL_CHUNK:
        name += f"/P{chunk}"
    return Config(name, policy, budget, formats, k, v, tail, block, floor, chunk)


def budget_tokens(budget: float, context_tokens: int) -> int:
    """The session's budget: llround(budget x context), at least 1."""
    return max(1, math.floor(budget * context_tokens + 0.5))


def num6(v: float) -> float:
    """Six significant digits, as records carry."""
    return float(f"{v:.6g}")


def agreement(ref: list, out: list) -> tuple[float, float]:
    """(prefix, token) agreement of `out` with the reference's tokens."""
    if not ref and not out:
        return 1.0, 1.0
    prefix = 0
    while prefix < len(ref) and prefix < len(out) and ref[prefix] == out[prefix]:
        prefix += 1
    same = sum(a == b for a, b in zip(ref, out))
    return (prefix / len(ref) if ref else 0.0), same / max(len(ref), len(out))


def agent_name(task: str, config: str, taken: set) -> str:
    """A daemon-legal agent id, unique within `taken` (which it joins)."""
    base = re.sub(r"[^A-Za-z0-9_.:-]", "_", f"{task}.{config.replace('+', '-')}")
    base = base[:AGENT_MAX_LEN]
    name, n = base, 1
    while name in taken:
        n += 1
        suffix = f".{n}"
        name = base[:AGENT_MAX_LEN - len(suffix)] + suffix
    taken.add(name)
    return name


@dataclass
class Task:
    id: str
    family: str
    file: str
    eval: object                     # the generation line's "eval", or None
    generation_line: int             # 1-based line of the turn under test
    question_line: int | None        # the user line before it, if any
    answer_prefix: str = ""
    generated_in_context: list = field(default_factory=list)  # other generation lines


def read_task(path: str) -> Task:
    """The task as bench/eval/task.cc reads it: the LAST assistant line
    without "content" is the turn under test, the user line right before it
    the question, everything before that the context."""
    lines = []
    with open(path, encoding="utf-8") as f:
        for no, text in enumerate(f, 1):
            if not text.strip():
                continue
            try:
                o = json.loads(text)
            except json.JSONDecodeError as e:
                raise LiveError(f"{path}:{no}: {e}") from None
            if not isinstance(o, dict):
                raise LiveError(f"{path}:{no}: expected a JSON object")
            lines.append((no, o))
    gens = [i for i, (_, o) in enumerate(lines)
            if o.get("role") == "assistant" and "content" not in o]
    if not gens:
        raise LiveError(f'{path}: no assistant line without "content" (the turn to evaluate)')
    g = gens[-1]
    no, o = lines[g]
    ev = o.get("eval") if isinstance(o.get("eval"), dict) else None
    family = ev.get("family") if ev and isinstance(ev.get("family"), str) else "script"
    tid = o["id"] if isinstance(o.get("id"), str) and o["id"] else (
        os.path.splitext(os.path.basename(path))[0])
    question = lines[g - 1][0] if g > 0 and lines[g - 1][1].get("role") == "user" else None
    return Task(tid, family, path, ev, no, question, o.get("answer_prefix") or "",
                [lines[i][0] for i in gens[:-1]])


def context_from_count(task: Task, count_lines: list[dict]) -> tuple[int, dict]:
    """(context tokens, model geometry) from `polykv-worker run TASK
    --count-tokens` output: the position of the question line (of the
    generation line when there is no question)."""
    geometry = next((c for c in count_lines if "num_layers" in c), None)
    if geometry is None:
        raise LiveError("polykv-worker --count-tokens printed no model geometry")
    if task.generated_in_context:
        raise LiveError(
            f"the context has generated turns (lines {task.generated_in_context}); live mode "
            "counts context tokens without running the model, so it runs only tasks whose "
            "context is all given messages")
    want = task.question_line or task.generation_line
    pos = next((c["position"] for c in count_lines if c.get("line") == want), None)
    if pos is None:
        raise LiveError(f"polykv-worker --count-tokens gave no position for line {want}")
    return int(pos), geometry


def bytes_per_token_f16(geometry: dict) -> int:
    """K and V of one token in f16 pages over every layer (2 bytes a channel)."""
    return 2 * 2 * geometry["num_layers"] * geometry["num_kv_heads"] * geometry["head_dim"]


def compaction_expected(budget: int, turns: list[dict], *, trigger: float,
                        chunk: int = PREFILL_CHUNK, fraction: float = 0.0) -> bool:
    """Whether the daemon must have compacted a session with this budget (with
    a fraction: its floor; daemon/compaction/compactor.cc SessionBudget) that
    wrote these turns: some Sync of the last turn saw more committed tokens
    than the policy's `trigger` (polykvd --describe-policy) allows
    (CompactionTarget: past budget + max(floor(budget x (trigger - 1)), 1)),
    had nothing been dropped before. The worker syncs before its first
    forward step and then at the cadence its turn reports
    (`sync_every_steps`, `sync_every_tokens`; a prefill chunk is one step).
    Earlier turns count as already committed (their slots are cached before
    the last one)."""
    if not turns:
        return False
    sync_every, sync_tokens = turns[-1]["sync_every_steps"], turns[-1]["sync_every_tokens"]

    def threshold(committed: int) -> int:
        b = max(budget, math.ceil(fraction * committed))
        return b + max(int(b * (max(trigger, 1.0) - 1.0)), 1)
    last = turns[-1]
    before = sum(t["prompt_tokens"] + t["completion_tokens"] - 1 for t in turns[:-1])
    steps = [chunk] * (last["prompt_tokens"] // chunk)
    if last["prompt_tokens"] % chunk:
        steps.append(last["prompt_tokens"] % chunk)
    steps += [1] * max(0, last["completion_tokens"] - 1)  # decode steps fed back
    committed = before
    since_steps, since_tokens = sync_every, 0  # a sync before the first step
    for n in steps:
        if since_steps >= sync_every or since_tokens >= sync_tokens:
            if committed > threshold(committed):
                return True
            since_steps, since_tokens = 0, 0
        committed += n
        since_steps += 1
        since_tokens += n
    return False


def base_record(task: Task, cfg: Config, context: int | None, bpt: int | None) -> dict:
    rec = {"task": task.id, "family": task.family, "file": task.file, "config": cfg.text,
           "policy": cfg.policy, "budget": num6(cfg.budget), "formats": cfg.formats,
           "k_format": cfg.k_format, "v_format": cfg.v_format,
           "block_tokens": cfg.block_tokens, "recent_f16_tokens": cfg.f16_tail,
           "prefill_chunk": cfg.prefill_chunk, "context_tokens": context,
           "bytes_per_token_f16": bpt, "eval": task.eval, "mode": "live"}
    if cfg.fractional:
        rec["budget_fraction"] = num6(cfg.budget)
    if cfg.f16_tail:
        rec["live_notes"] = [
            f"the f16 recent window: the worker attends its newest pages covering at "
            f"least {cfg.f16_tail} tokens (and the page being filled) from f16 copies"]
    return rec


def policy_trigger(bins: "Bins", policy: str) -> float:
    """The policy's compaction trigger, from polykvd itself (its grammar and
    defaults are the daemon's: nothing here re-derives them)."""
    p = subprocess.run([bins.polykvd, "--describe-policy", policy], capture_output=True,
                       text=True)
    if p.returncode != 0:
        raise LiveError(tool_error("polykvd --describe-policy", p.stderr or p.stdout))
    return float(json.loads(p.stdout)["trigger"])


def live_record(task: Task, cfg: Config, context: int, bpt: int, budget: int | None,
                agent: str, turns: list[dict], summary: dict | None, ref: dict | None,
                seconds: float) -> dict:
    """The record of one finished worker run (REQUIRES: turns non-empty).
    `ref`: the task's live reference record (None when this is it)."""
    rec = base_record(task, cfg, context, bpt)
    last = turns[-1]
    want_cache = f"pool-{cfg.k_format}-{cfg.v_format}"
    rec.update({"agent": agent, "budget_tokens": budget, "cache": last.get("cache"),
                "compactions": last.get("epoch"), "worker_seconds": round(seconds, 2)})
    if last.get("cache") != want_cache:
        rec["error"] = (f"polykvd stored the session as {last.get('cache')}, not the "
                        f"{want_cache} the config asks for")
        return rec
    if (last.get("recent_f16_tokens") or 0) != cfg.f16_tail:
        rec["error"] = (f"polykv-worker kept {last.get('recent_f16_tokens') or 0} recent tokens "
                        f"in f16, not the {cfg.f16_tail} the config asks for")
        return rec
    if last.get("block_tokens") != cfg.block_tokens:
        rec["error"] = (f"polykvd opened the session with pages of {last.get('block_tokens')} "
                        f"tokens, not the {cfg.block_tokens} the config asks for")
        return rec
    if "tokens" not in last or "sync_every_steps" not in last:
        rec["error"] = ("polykv-worker printed no token ids or sync cadence (rebuild it: this "
                        "run's is too old)")
        return rec
    fraction = cfg.budget if cfg.fractional else 0.0
    if (budget is not None and cfg.trigger is not None and not last.get("epoch")
            and compaction_expected(budget, turns, trigger=cfg.trigger, chunk=cfg.prefill_chunk,
                                    fraction=fraction)):
        what = (f"budget {cfg.budget:g} of the context, at least {budget} tokens"
                if cfg.fractional else f"budget {budget} tokens")
        rec["error"] = (f"polykvd never compacted the session ({what}, "
                        f"{last.get('cached_tokens')} cached at the end); see polykvd.log and "
                        "polykv_ladder_steps_total{step=\"compaction_failed\"}")
        return rec
    tokens = list(last["tokens"])
    prefix = task.answer_prefix
    ref_tokens = tokens if ref is None else (ref.get("output_tokens") or [])
    a_prefix, a_token = agreement(ref_tokens, tokens)
    peak = (summary or last).get("kv_bytes_peak", last.get("kv_bytes_peak"))
    full = peak if ref is None else ref.get("bytes_peak")
    dec = last.get("decode_tokens_per_s")
    pre = (summary or last).get("prefill_tokens_per_s")
    rec.update({
        "question_tokens": sum(t["prompt_tokens"] for t in turns) - context,
        "kept_slots_mean": None, "merged_groups": None, "bytes_context": None,
        "bytes_peak": peak, "bytes_mean": None,
        "bytes_final": (summary or last).get("kv_bytes"),
        "bytes_full_f16": full,
        "bytes_fraction": num6(peak / full) if peak and full else None,
        "answer_prefix": prefix, "output": prefix + last.get("text", ""),
        "output_tokens": tokens, "stop": last.get("stop"),
        "ref_tokens_len": len(ref_tokens),
        "prefix_agreement": num6(a_prefix), "token_agreement": num6(a_token),
        "decode_tokens_per_s": num6(dec) if dec is not None else None,
        "compaction_ms": None,
        "prefill_tokens_per_s": num6(pre) if pre is not None else None,
        "cached_tokens": last.get("cached_tokens"),
    })
    rec.setdefault("live_notes", []).append(NULL_FIELDS_NOTE)
    return rec


def forced_fields(turn: dict) -> dict:
    """The teacher-forced measures of a `--teacher-force` run's turn."""
    return {k: turn.get(k) for k in ("forced_positions", "kl_mean", "kl_max", "top1_agreement",
                                      "target_logprob_mean")}


def parse_worker_output(text: str) -> tuple[list[dict], dict | None]:
    turns, summary = [], None
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            o = json.loads(line)
        except json.JSONDecodeError:
            continue
        if o.get("summary"):
            summary = o
        elif "text" in o:
            turns.append(o)
    return turns, summary


def tool_error(what: str, stderr: str) -> str:
    """The last meaningful line a tool printed, its own prefix dropped
    ("polykvctl: INVALID_ARGUMENT: ..." -> "INVALID_ARGUMENT: ...")."""
    lines = [x.strip() for x in (stderr or "").splitlines() if x.strip()]
    last = lines[-1] if lines else "no message"
    for prefix in ("polykvctl: ", "polykv-worker: "):
        if last.startswith(prefix):
            last = last[len(prefix):]
    return f"{what}: {last}"[:600]


def eta(done: int, total: int, elapsed: float) -> str:
    if done == 0:
        return "?"
    return clock(elapsed / done * (total - done))


def clock(s: float) -> str:
    s = int(s)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


# --------------------------------------------------------------------------
# The daemon


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    """polykvd on a private socket (in a temp dir), its log at `log_path`,
    metrics on a free local port; stop() sends SIGTERM (it drains). `extra`:
    more polykvd flags (e.g. --arena-bytes)."""

    def __init__(self, binary: str, pool_bytes: int, log_path: str, extra: tuple = ()):
        self.dir = tempfile.mkdtemp(prefix="polykv-eval-live.")
        self.socket = os.path.join(self.dir, "polykvd.sock")
        self.metrics = f"127.0.0.1:{free_port()}"
        # A longer lease than the default 5 s: on a box that the run keeps
        # busy, a starved worker's heartbeat came late and its session was
        # reclaimed mid-answer (2026-12-03). Leases are not what is measured.
        self.cmd = [binary, "--socket", self.socket, "--metrics-address", self.metrics,
                    "--pool-bytes", f"{pool_bytes >> 20}MiB", "--lease-ms", str(LEASE_MS),
                    *extra]
        self.log_path = log_path
        self.proc = None

    def start(self, timeout_s: float = 20) -> None:
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT)
        t0 = time.monotonic()
        while not os.path.exists(self.socket):
            if self.proc.poll() is not None or time.monotonic() - t0 > timeout_s:
                self.stop()
                with open(self.log_path) as f:
                    tail = f.read()[-800:]
                raise LiveError(f"polykvd did not start ({shlex.join(self.cmd)}):\n{tail}")
            time.sleep(0.05)

    def scrape(self, prefixes=("polykv_compactions_total", "polykv_evicted_tokens_total",
                               "polykv_merged_tokens_total", "polykv_ladder_steps_total",
                               "polykv_compaction_blocks_total")) -> list[str]:
        """The metrics lines that say what compaction did; [] if unreachable."""
        try:
            with urllib.request.urlopen(f"http://{self.metrics}/metrics", timeout=5) as r:
                text = r.read().decode("utf-8", "replace")
        except OSError:
            return []
        return [x for x in text.splitlines() if x.startswith(prefixes)]

    def stop(self, timeout_s: float = 30) -> int | None:
        rc = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                rc = self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                rc = self.proc.wait()
        elif self.proc is not None:
            rc = self.proc.returncode
        if getattr(self, "_log", None):
            self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        return rc


def metric_values(lines: list[str]) -> dict:
    """{'name{labels}': value} from Prometheus text lines."""
    out = {}
    for x in lines:
        k, _, v = x.rpartition(" ")
        try:
            out[k] = float(v)
        except ValueError:
            pass
    return out


# --------------------------------------------------------------------------
# The run


@dataclass
class Bins:
    polykvd: str
    worker: str
    ctl: str

    @staticmethod
    def at(bin_dir: str) -> "Bins":
        return Bins(*(os.path.join(bin_dir, b) for b in ("polykvd", "polykv-worker", "polykvctl")))

    def missing(self) -> list[str]:
        return [p for p in (self.polykvd, self.worker, self.ctl) if not os.access(p, os.X_OK)]


def list_tasks(tasks_dir: str) -> list[str]:
    """*.jsonl under tasks_dir, sorted."""
    return sorted(os.path.join(tasks_dir, f) for f in os.listdir(tasks_dir)
                  if f.endswith(".jsonl") and os.path.isfile(os.path.join(tasks_dir, f)))


def count_tokens(bins: Bins, model: str, path: str) -> list[dict]:
    p = subprocess.run([bins.worker, "run", path, "--count-tokens", "--model", model],
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise LiveError(tool_error("polykv-worker --count-tokens", p.stderr))
    return [json.loads(x) for x in p.stdout.splitlines() if x.strip()]


def needs_forced_pass(rec: dict | None, c: Config, teacher_force: bool) -> bool:
    """Whether a record answered without its forced pass (a run with
    --no-teacher-force, or a forced pass that failed)."""
    if not teacher_force or rec is None or rec.get("error"):
        return False
    # The reference's forced pass is what the others are scored against.
    return not rec.get("reference_logprobs" if c.text == REFERENCE else "forced_positions")


def read_records(path: str, hint: str) -> dict[tuple[str, str], dict]:
    """The live records of a results.jsonl (or a committed scored.jsonl.gz)
    by (task, config), the last of a pair kept; LiveError (with hint) at a
    record that is not live."""
    records = {}
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        for no, line in enumerate(f, 1):
            if not line.strip():
                continue
            r = json.loads(line)
            if r.get("mode") != "live":
                raise LiveError(f"{path}:{no} is not a live record; {hint}")
            records[(r["task"], r["config"])] = r
    return records


def write_records(path: str, records) -> None:
    """Rewrites path with records, one line each (atomically: a crash keeps
    the old file)."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in records))
    os.replace(tmp, path)


def run_live(tasks_dir: str, config_texts: list[str], model: str, out_dir: str, bin_dir: str,
             threads: int, resume: bool, log, teacher_force: bool = True) -> dict:
    """Runs every (task, config) live and appends the records to
    out_dir/results.jsonl (kept with --resume: pairs already there are
    skipped). Returns what meta.json records about the run."""
    bins = Bins.at(bin_dir)
    configs = []
    for t in [REFERENCE] + config_texts:
        c = parse_config(t)
        if c.text not in [x.text for x in configs]:
            configs.append(c)
    for c in configs:
        if not c.full:
            try:
                c.trigger = policy_trigger(bins, c.policy)
            except LiveError:
                pass  # the daemon refuses the policy: each task's record says so
    results = os.path.join(out_dir, "results.jsonl")
    workers_dir = os.path.join(out_dir, "live")
    os.makedirs(workers_dir, exist_ok=True)
    done: dict[tuple[str, str], dict] = {}
    if resume and os.path.exists(results):
        done = read_records(results, "--resume continues live runs only (use another --name)")
        write_records(results, done.values())
    elif os.path.exists(results):
        os.remove(results)
    n_resumed = len(done)

    # Tasks, their context and geometry; a task that cannot run live gets an
    # error record for every config.
    tasks = []
    for path in list_tasks(tasks_dir):
        task = read_task(path)
        try:
            ctx, geo = context_from_count(task, count_tokens(bins, model, path))
            if ctx + 64 > geo["context_length"]:
                raise LiveError(f"context of {ctx} tokens leaves no room in the model's "
                                f"{geo['context_length']}")
            tasks.append((task, ctx, geo, None))
        except LiveError as e:
            tasks.append((task, None, None, str(e)))
    if len({t.id for t, *_ in tasks}) != len(tasks):
        raise LiveError("two task files share a task id; live records are keyed by task id")

    lock = threading.Lock()
    out = open(results, "a")

    def write(rec: dict) -> None:
        with lock:
            out.write(json.dumps(rec) + "\n")
            out.flush()
            done[(rec["task"], rec["config"])] = rec

    taken: set = set()
    todo = []
    n_forced_only = 0
    for task, ctx, geo, err in tasks:
        for c in configs:
            if needs_forced_pass(done.get((task.id, c.text)), c, teacher_force):
                # Answered by a run without teacher forcing (a screen,
                # --no-teacher-force): only the forced pass is missing.
                agent = done[(task.id, c.text)]["agent"]
                taken.add(agent)
                todo.append((task, ctx, geo, c, agent))
                n_forced_only += 1
                continue
            if (task.id, c.text) in done:
                continue
            if err is not None:
                rec = base_record(task, c, ctx, None)
                rec["error"] = err
                write(rec)
                continue
            todo.append((task, ctx, geo, c, agent_name(task.id, c.text, taken)))
    if resume:
        log(f"live: {n_resumed} (task, config) pairs already in {results}, skipped"
            + (f"; {n_forced_only} answered without teacher forcing get their forced pass"
               if n_forced_only else ""))
    if not todo:
        out.close()
        return {"daemon": None, "runs": 0}

    max_ctx = max(ctx for _, ctx, _, _, _ in todo)
    bpt = max(bytes_per_token_f16(geo) for _, _, geo, _, _ in todo)
    wide = 2 if any("f32" in (c.k_format, c.v_format) for *_, c, _ in todo) else 1
    # A session holds at most its context, question and answer (plus the
    # worker's 64 reserved slots and block rounding); each running worker one
    # session, and a compaction briefly needs its new pages beside the old.
    session = (max_ctx + 512 + DEFAULT_MAX_NEW_TOKENS + 96) * bpt * wide
    pool = max(256 << 20, -(-3 * threads * session // (64 << 20)) * (64 << 20))
    daemon = Daemon(bins.polykvd, pool, os.path.join(out_dir, "polykvd.log"))
    daemon.start()
    log(f"live: polykvd on {daemon.socket} (pool {pool >> 20} MiB, metrics {daemon.metrics}, "
        f"log {daemon.log_path}); {len(todo)} worker runs, {threads} at a time")

    def one(task: Task, ctx: int, geo: dict, c: Config, agent: str) -> dict:
        ref = None if c.text == REFERENCE else done.get((task.id, REFERENCE))
        if (task.id, c.text) in done:  # recorded: it only needs its forced pass
            rec = dict(done[(task.id, c.text)])
            rec.pop("forced_error", None)
            base = os.path.join(workers_dir, agent)
            return forced_pass(task, c, agent, rec, ref, base,
                               qos_command(agent, c, rec.get("budget_tokens")),
                               base + ".logprobs.jsonl" if ref is None else None,
                               rec.get("worker_seconds") or 0.0)
        rec = base_record(task, c, ctx, bytes_per_token_f16(geo))
        if c.text != REFERENCE and (ref is None or ref.get("error")):
            rec["error"] = (f"the reference {REFERENCE} failed for this task: "
                            + (ref or {}).get("error", "no record"))
            return rec
        # budget_tokens: the budget, or with /F<n> the fractional budget's
        # floor (a default QoS knows no context length).
        budget = (None if c.full else c.budget_floor if c.fractional
                  else budget_tokens(c.budget, ctx))
        qos = qos_command(agent, c, budget)
        p = subprocess.run(qos, capture_output=True, text=True)
        if p.returncode != 0:
            rec.update({"agent": agent, "budget_tokens": budget,
                        "error": tool_error("polykvctl qos set", p.stderr or p.stdout)})
            return rec
        base = os.path.join(workers_dir, agent)
        logprobs = base + ".logprobs.jsonl" if c.text == REFERENCE else None
        rc, turns, summary, err, seconds = run_worker(task, c, agent, base, logprobs_out=logprobs)
        if rc != 0 or not turns:
            rec.update({"agent": agent, "budget_tokens": budget,
                        "error": tool_error(f"polykv-worker (exit {rc})", err)})
            return rec
        rec = live_record(task, c, ctx, bytes_per_token_f16(geo), budget, agent, turns,
                          summary, ref, seconds)
        if not teacher_force or rec.get("error"):
            return rec
        return forced_pass(task, c, agent, rec, ref, base, qos, logprobs, seconds)

    def qos_command(agent: str, c: Config, budget: int | None) -> list[str]:
        # Everything the daemon stores through the agent's QoS (the Admin
        # API), as an operator sets it: the worker asks for nothing.
        return [bins.ctl, "--socket", daemon.socket, "qos", "set", agent,
                "--policy", c.policy, "--budget-tokens", str(budget or 0),
                "--budget-fraction", f"{c.budget:g}" if c.fractional else "0",
                "--key-format", c.k_format, "--value-format", c.v_format,
                "--block-tokens", str(c.block_tokens)]

    def forced_pass(task: Task, c: Config, agent: str, rec: dict, ref: dict | None, base: str,
                    qos: list[str], logprobs: str | None, seconds: float) -> dict:
        # The same config again, teacher-forced on the reference's answer,
        # as its own session: its agent has the same QoS. The reference's
        # forced run records the distributions the others are scored against
        # (client/worker/logprobs.h: a forced pass rounds unlike decode).
        ref_logprobs = logprobs if ref is None else os.path.join(
            out_dir, ref.get("reference_logprobs") or "")
        if not os.path.isfile(ref_logprobs):
            rec["forced_error"] = (f"the reference's log-probabilities ({ref_logprobs}) are "
                                   "missing: its forced run failed (see its forced_error), or "
                                   "its record predates them (run again without --resume)")
            return rec
        tf_agent = agent[:AGENT_MAX_LEN - 3] + ":tf"
        qos[qos.index(agent)] = tf_agent
        p = subprocess.run(qos, capture_output=True, text=True)
        if p.returncode != 0:
            rec["forced_error"] = tool_error("polykvctl qos set", p.stderr or p.stdout)
            return rec
        forced_out = base + ".tf.logprobs.jsonl" if ref is None else None
        rc, tf_turns, _, err, tf_seconds = run_worker(task, c, tf_agent, base + ".tf",
                                                      logprobs_out=forced_out,
                                                      teacher_force=ref_logprobs)
        rec["worker_seconds"] = round(seconds + tf_seconds, 2)
        if rc != 0 or not tf_turns:
            rec["forced_error"] = tool_error(f"polykv-worker --teacher-force (exit {rc})", err)
            return rec
        rec.update(forced_fields(tf_turns[-1]))
        if forced_out:
            rec["reference_logprobs"] = os.path.relpath(forced_out, out_dir)
        return rec

    def run_worker(task: Task, c: Config, agent: str, base: str, logprobs_out: str | None = None,
                   teacher_force: str | None = None):
        """One polykv-worker run: (exit code, turns, summary, stderr, seconds)."""
        cmd = [bins.worker, "run", task.file, "--daemon", daemon.socket, "--tenant", TENANT,
               "--agent", agent, "--block-tokens", "0", "--recent-f16-tokens", str(c.f16_tail),
               "--threads", "1", "--max-new-tokens", str(DEFAULT_MAX_NEW_TOKENS),
               "--prefill-chunk", str(c.prefill_chunk), "--model", model, "--summary"]
        if logprobs_out:
            cmd += ["--logprobs-out", logprobs_out]
        if teacher_force:
            cmd += ["--teacher-force", teacher_force]
        t0 = time.monotonic()
        try:
            with open(base + ".jsonl", "w") as so, open(base + ".err", "w") as se:
                se.write("$ " + shlex.join(cmd) + "\n")
                se.flush()
                rc = subprocess.run(cmd, stdout=so, stderr=se, timeout=WORKER_TIMEOUT_S).returncode
        except subprocess.TimeoutExpired:
            rc = f"killed after {WORKER_TIMEOUT_S} s"
        seconds = time.monotonic() - t0
        with open(base + ".jsonl") as f:
            turns, summary = parse_worker_output(f.read())
        with open(base + ".err") as f:
            err = f.read()
        return rc, turns, summary, err, seconds

    t_start = time.monotonic()
    n_done, total = 0, len(todo)
    # In an order fixed by the task ids but mixing the families, so that a
    # run stopped part-way (and --resume'd later) has sampled all of them.
    def mixed(task_id: str) -> bytes:
        return hashlib.sha256(task_id.encode()).digest()

    refs = sorted((j for j in todo if j[3].text == REFERENCE), key=lambda j: mixed(j[0].id))
    rest = {}
    for j in todo:
        if j[3].text != REFERENCE:
            rest.setdefault(j[0].id, []).append(j)
    failed = 0
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, threads)) as pool_x:
            pending = {pool_x.submit(one, *j): j for j in refs}
            # Tasks whose reference is already recorded (forced pass and
            # all) start at once.
            waiting = {j[0].id for j in refs}
            for tid in sorted(rest, key=mixed):
                if (tid, REFERENCE) in done and tid not in waiting:
                    for j in rest.pop(tid):
                        pending[pool_x.submit(one, *j)] = j
            while pending:
                finished, _ = concurrent.futures.wait(
                    pending, return_when=concurrent.futures.FIRST_COMPLETED)
                for fut in finished:
                    task, _, _, c, _ = pending.pop(fut)
                    rec = fut.result()
                    write(rec)
                    n_done += 1
                    failed += bool(rec.get("error"))
                    elapsed = time.monotonic() - t_start
                    what = (f"error: {rec['error'][:120]}" if rec.get("error") else
                            f"{len(rec['output_tokens'])} tokens, agreement "
                            f"{rec['token_agreement']:.2f}, "
                            + (f"KL {rec['kl_mean']:.4f}, " if rec.get("kl_mean") is not None
                               else "") +
                            f"{rec.get('compactions') or 0} "
                            f"compactions, {rec['worker_seconds']:.1f} s")
                    log(f"live [{n_done}/{total}] {task.id} {c.text}: {what}; elapsed "
                        f"{clock(elapsed)}, ~{eta(n_done, total, elapsed)} left")
                    if c.text == REFERENCE:
                        for j in rest.pop(task.id, []):
                            pending[pool_x.submit(one, *j)] = j
    finally:
        out.close()
        # A forced pass on its own appended its record again: keep the last.
        write_records(results, done.values())
        metrics = daemon.scrape()
        rc = daemon.stop()
    with open(os.path.join(out_dir, "polykvd_metrics.txt"), "w") as f:
        f.write("".join(x + "\n" for x in metrics))
    values = metric_values(metrics)
    ladder = {k: v for k, v in values.items() if k.startswith("polykv_ladder_steps_total") and v}
    if ladder:
        log(f"warning: polykvd's pressure ladder acted during the run ({ladder}); the pool "
            "was too small, or compactions failed (polykvd.log)")
    return {"daemon": {"command": shlex.join(daemon.cmd), "pool_bytes": pool, "exit": rc,
                       "log": "polykvd.log", "metrics": values},
            "runs": total, "failed": failed,
            "worker": {"threads": 1, "max_new_tokens": DEFAULT_MAX_NEW_TOKENS,
                       "prefill_chunk": PREFILL_CHUNK, "tenant": TENANT}}


if __name__ == "__main__":
    sys.exit("bench/eval/live.py is a module of eval.py: run eval.py --live")
