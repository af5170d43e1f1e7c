"""Shared pieces of the workload generators: task files, sizing, seeding.

A task is one JSONL file in polykv-worker's script format. Every line but the
last is a chat message; the line before the last is the final user question
and the last is the generation line, an assistant line without "content" that
carries the task id, max_new_tokens, a plan-step intent, the answer_prefix
(the start of the reply, prefilled by the worker) and the "eval" object the
scorer reads. Everything before the question is context: the worker
prefills it and lets the cache policy under test compress it before the
question arrives, so an answer is only reachable if the policy kept it.

Sizes are estimates, not tokenizer counts (the generators are stdlib only).
A flat characters-per-token rule (3.6 for prose, 3.0 for code) is far off for
SmolLM2's tokenizer, which splits every digit: server logs came out 1.33x and
JSON 1.3x larger than estimated. est_tokens() instead counts pieces -- words
by number and length, single digits, punctuation runs, line breaks -- with
weights fitted by least squares to SmolLM2-135M-Instruct's tokenizer on
generated tasks and HumanEval prompts (median error 4%, per family within
about 10%). Each message adds a few tokens of ChatML framing.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import re
from dataclasses import dataclass, field

# <|im_start|>role\n ... <|im_end|>\n
MESSAGE_OVERHEAD_TOKENS = 5
# The model's window is 8192; the rest is slack for estimate error.
HARD_CAP_TOKENS = 8000

_PIECES = re.compile(r"(?P<w>[A-Za-z]+)|(?P<d>\d)|(?P<s>\s+)|(?P<p>[^\sA-Za-z\d]+)")


def est_tokens(text: str) -> int:
    """Estimated SmolLM2 (GPT-2-like BPE) token count of text."""
    n = 0.0
    for m in _PIECES.finditer(text):
        kind, piece = m.lastgroup, m.group()
        if kind == "w":
            n += 0.55 + 0.1 * len(piece)
        elif kind == "d":
            n += 1.1
        elif kind == "s":
            n += 0.0 if piece == " " else 2.1
        else:
            n += 0.9 + 0.1 * len(piece)
    return math.ceil(n)


# Policies and their defaults are tuned on "dev"; headlines come from "test"
# only. The two never share a task: generated families draw from different
# run seeds, data families (bfcl, humaneval) from disjoint halves of the
# public problems.
SPLITS = ("dev", "test")


def split_run_seed(seed: int, split: str) -> int:
    """The run seed the generators use: --seed itself for dev (so the
    generated families' dev tasks are those of the runs before splits
    existed), a seed derived from it for test."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r} (choose from {', '.join(SPLITS)})")
    return seed if split == "dev" else task_seed(seed, "split:test", 0)


def problem_split(key: str) -> str:
    """Which split a public problem (its id) belongs to, for any seed."""
    return SPLITS[hashlib.sha256(f"polykv-split:{key}".encode()).digest()[0] & 1]


def task_seed(seed: int, family: str, index: int) -> int:
    """A per-task seed that does not depend on which other families run."""
    digest = hashlib.sha256(f"polykv-eval:{seed}:{family}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def size_targets(seed: int, family: str, n: int, lo: int, hi: int) -> list[int]:
    """n sizes spread evenly over [lo, hi]: one draw per stratum, shuffled.

    Stratifying keeps small runs (n = 4) covering the whole range instead of
    clumping where plain uniform draws happen to fall.
    """
    rng = random.Random(task_seed(seed, family, -1))
    # Generators land within about 70 tokens of a target; keep them inside.
    margin = min(75, (hi - lo) // 10)
    lo, hi = lo + margin, hi - margin
    out = [int(lo + (i + rng.random()) * (hi - lo) / n) for i in range(n)]
    rng.shuffle(out)
    return out


@dataclass
class Conversation:
    """Messages in order with a running size estimate."""

    messages: list[dict] = field(default_factory=list)
    tokens: int = 0

    def add(self, role: str, content: str, intent: str | None = None) -> dict:
        msg = {"role": role, "content": content}
        if intent:
            msg["intent"] = intent
        self.messages.append(msg)
        self.tokens += est_tokens(content) + MESSAGE_OVERHEAD_TOKENS
        return msg

    def cost(self, content: str) -> int:
        return est_tokens(content) + MESSAGE_OVERHEAD_TOKENS


@dataclass
class Task:
    task_id: str
    family: str
    seed: int
    conv: Conversation            # context plus the final user question
    max_new_tokens: int
    intent: str                   # the plan step of the generated turn; never the answer
    eval: dict
    extra_manifest: dict = field(default_factory=dict)
    # The start of the reply, prefilled by the worker after the question
    # ("The order number of Alice Park is"): a small model then continues
    # with a copy instead of a paraphrase. Never contains the answer.
    answer_prefix: str = ""
    # The window the task must fit (its tokens plus the reply).
    cap_tokens: int = HARD_CAP_TOKENS

    @property
    def approx_tokens(self) -> int:
        return self.conv.tokens

    def generation_line(self) -> dict:
        line = {
            "role": "assistant",
            "id": self.task_id,
            "max_new_tokens": self.max_new_tokens,
            "intent": self.intent,
        }
        if self.answer_prefix:
            line["answer_prefix"] = self.answer_prefix
        line["eval"] = self.eval
        return line

    def check(self) -> None:
        msgs = self.conv.messages
        if len(msgs) < 2 or msgs[-1]["role"] != "user":
            raise AssertionError(f"{self.task_id}: the last message must be the user question")
        if self.approx_tokens + self.max_new_tokens > self.cap_tokens:
            raise AssertionError(
                f"{self.task_id}: {self.approx_tokens} + {self.max_new_tokens} tokens exceeds "
                f"{self.cap_tokens}")
        for a in self.eval.get("answers", []):
            if a and a.lower() in self.intent.lower():
                raise AssertionError(f"{self.task_id}: the intent leaks the answer")
            if a and a.lower() in self.answer_prefix.lower():
                raise AssertionError(f"{self.task_id}: the answer prefix leaks the answer")


def write_task(out_dir: str, task: Task) -> str:
    task.check()
    name = f"{task.task_id}.jsonl"
    path = os.path.join(out_dir, name)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for msg in task.conv.messages:
            f.write(json.dumps(msg) + "\n")
        f.write(json.dumps(task.generation_line()) + "\n")
    return name


def read_task(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def fit_lines(lines: list[str], budget_tokens: int, keep_head: int = 0) -> str:
    """Joins as many leading lines as fit in budget_tokens (at least keep_head)."""
    out, used = [], 0
    for i, line in enumerate(lines):
        cost = est_tokens(line) + 2
        if used + cost > budget_tokens and i >= keep_head:
            break
        out.append(line)
        used += cost
    return "\n".join(out)


_PREFIXED_ID = re.compile(r"^[A-Za-z]+[0-9]?-([0-9A-Za-z]{4,})$")


def answer_variants(value: str) -> list[str]:
    """value first, then its distinctive core when it has a generic prefix.

    SmolLM2-135M often copies the number of an id but drops the prefix
    ("48213" for "ORD-48213", "6.6.6" for "v6.6.6"); that is still the fact.
    Cores are at least four characters, so a chance match stays unlikely.
    """
    out = [value]
    if m := _PREFIXED_ID.match(value):
        out.append(m.group(1))
    elif re.fullmatch(r"v\d+\.\d+\.\d+", value):
        out.append(value[1:])
    elif value.endswith(".internal"):
        out.append(value.removesuffix(".internal"))
    elif value.startswith("s3://"):
        out.append(value.removeprefix("s3://"))
    return [a for i, a in enumerate(out) if i == 0 or len(a) >= 4]


def contains_any(text: str, needles: list[str]) -> bool:
    low = text.lower()
    return any(n and n.lower() in low for n in needles)
