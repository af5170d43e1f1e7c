"""Family `longagent`: agent-length sessions of 6K-12K tokens across hand-offs.

One long session worked by a relay of agents (issue 43, scope 3): a system
prompt with the team's tool schemas (multiagent's), then phases, each opened
by a hand-off note from the previous agent ("Hand-off from agent 2 to agent
3: ...", naming what was looked at, never a value). The first phase holds the
detail asked at the end:

  kind "recall": the user states facts (recall's scenarios: orders, a
                 traveller, a project, contacts) and the agent acknowledges;
  kind "tools":  an incident and a tool trace (tools' key outputs: a 5xx log
                 line, a Java frame, a failing test, a job id), the detail
                 always noted by the assistant after it, as an agent that
                 hands its work on writes down what it found (un-noted, the
                 0.5B model under the full cache found 0 of 6 such details
                 at 6K-11K tokens, noted 1 of 2:
                 docs/results/2026-12-07-longagent-dev-screen).

Every phase then runs long tool rounds in agent style (source files, logs,
JSON listings, search results, articles, test runs: filler's rounds, up to
~1800 tokens each), so the session reads like repository files and long tool
logs, and the detail ends up thousands of tokens before the question. The
final user message asks for that detail, with recall's or tools' question and
answer prefix. Sizes spread over 6000-12000 estimated tokens (LONG_MIN_TOKENS,
LONG_MAX_TOKENS), whatever gen.py's --min-tokens/--max-tokens say for the
short families; the window needed (LONG_CAP_TOKENS) is Qwen2.5's, not
SmolLM2's.

eval carries "kind", "handoffs" and "detail" (the tools key, for kind tools).
Scoring: "contains", as in recall and tools.
"""

from __future__ import annotations

import random

import filler
import multiagent
import recall
import tools
from common import Conversation, Task, answer_variants

FAMILY = "longagent"
LONG_MIN_TOKENS = 6000
LONG_MAX_TOKENS = 12000
# Qwen2.5's window is 32K; the family stays far below it (and the worker's
# chunked prefill keeps a 12K context's activations small).
LONG_CAP_TOKENS = 16000
SYSTEM_TOKENS = 900
# Long tool outputs: repository files and logs as an agent reads them.
ROUND_TOKENS = (500, 1800)

HANDOFF = [
    "Hand-off from agent {a} to agent {b}: I went through {what}. Nothing is fixed yet; the "
    "notes above are complete. Continue from here.",
    "Agent {a} signing off, agent {b} taking over. Covered so far: {what}. Please keep going "
    "with the remaining checks.",
    "Shift change (agent {a} -> agent {b}). Summary: {what}. No decisions were taken; carry on.",
]
WHAT = ["the service logs of the last hour", "the failing test runs", "the scheduler's job list",
        "the relevant source files", "the knowledge base articles", "the API listings",
        "the recent deploys and their configs", "the customer's earlier requests"]


def _handoff(rng: random.Random, a: int) -> str:
    what = ", ".join(rng.sample(WHAT, 2))
    return rng.choice(HANDOFF).format(a=a, b=a + 1, what=what)


def generate(rng: random.Random, task_id: str, seed: int, target: int) -> Task:
    conv = Conversation()
    conv.add("system", multiagent.shared_prefix(rng, SYSTEM_TOKENS))
    kind = rng.choice(["recall", "tools"])
    handoffs = rng.randint(2, 4)
    # The first phase: the detail, then its share of the long rounds.
    phase = (target - conv.tokens - 80 * handoffs) // (handoffs + 1)
    detail = None
    if kind == "recall":
        question, answer, prefix = recall.build_turns(rng, conv, phase)
    else:
        question, answer, prefix, detail = tools.build_turns(rng, conv, phase, noted=True)
    # A passing test run after the failing one asked about would contradict it.
    kinds = [k for k in tools.FILLER_KINDS
             if k != "tests" or not (detail or "").startswith("pytest")]
    for h in range(handoffs):
        conv.add("user", _handoff(rng, h + 1), intent="user: hands the session over")
        left = target - conv.tokens - conv.cost(question)
        budget = left // (handoffs - h)
        filler.add_rounds(rng, conv, budget, [answer], kinds, style="agent",
                          round_tokens=ROUND_TOKENS)
    conv.add("user", question, intent="user: asks about a detail from the first agent's turns")
    ev = {"family": FAMILY, "scorer": "contains", "answers": answer_variants(answer),
          "kind": kind, "handoffs": handoffs}
    if detail:
        ev["detail"] = detail
    return Task(task_id, FAMILY, seed, conv, 24, "answer: recall a detail from the session's start",
                ev, answer_prefix=prefix, cap_tokens=LONG_CAP_TOKENS)
