"""Distractor turns: tool calls whose output is irrelevant to the final
question, with the short assistant decisions and user requests around them.

They fill a task up to its size target and put distance (and plausible
look-alike ids, names and numbers) between a fact and the question about it,
which is where a compressing cache policy either keeps the fact or loses it.
"""

from __future__ import annotations

import random

import codegen
import text
from common import Conversation, fit_lines

# Below this many tokens a round is not worth adding.
MIN_ROUND_TOKENS = 120


def _log_round(rng, budget, avoid):
    service = rng.choice(text.SERVICES)
    lines = text.server_log(rng, budget, service, avoid)
    return (f"Can you check the {service} logs from this morning?",
            f"I'll pull the recent {service} logs.",
            f"tool: tail_logs {service}", "\n".join(lines),
            rng.choice([f"The {service} logs look normal: mostly 2xx responses and a few 404s and 409s.",
                        f"Nothing alarming in the {service} logs; latency is within the usual range."]))


def _search_round(rng, budget, avoid):
    query, body = text.search_results(rng, budget, avoid)
    return (f"Search the knowledge base for {query}.",
            f"Searching the knowledge base for \"{query}\".",
            f"tool: search_kb {query}", body,
            "Those results are general background; none of them changes what we are doing.")


def _article_round(rng, budget, avoid):
    body = text.article(rng, budget, avoid)
    title = body.split("\n", 1)[0]
    return ("Pull up the latest post on the engineering blog, I want to skim it.",
            "Fetching the latest engineering blog post.",
            "tool: fetch_url blog", body,
            f"The post is titled \"{title}\". It is mostly about operations; nothing for us to act on.")


def _json_round(rng, budget, avoid):
    endpoint, body = text.json_records(rng, budget, avoid)
    what = endpoint.split("/")[2].split("?")[0]
    return (f"List the most recent {what} from the API.",
            f"Calling {endpoint}.",
            f"tool: http_get {endpoint}", body,
            f"That is one page of {what}; there are more pages if you need them.")


def _code_round(rng, budget, avoid):
    used: dict = {}
    lang = "py" if rng.random() < 0.75 else "js"
    path, body, _ = codegen.source_file(rng, lang, used, rng.randint(4, 12))
    if any(a and a.lower() in body.lower() for a in avoid):
        body = "\n".join(l for l in body.split("\n") if not any(a and a.lower() in l.lower() for a in avoid))
    body = fit_lines(body.split("\n"), budget)
    return (f"Open {path}, I want to see how it is structured.",
            f"Reading {path}.",
            f"tool: read_file {path}", body,
            f"{path} is a list of small helpers; nothing there touches what we discussed.")


def _tests_round(rng, budget, avoid):
    n = max(4, (budget - 80) // 22)
    return ("Run the test suite to make sure everything still passes.",
            "Running the test suite.",
            "tool: run_tests", text.pytest_run(rng, n, None, avoid=list(avoid)),
            "All tests pass.")


ROUNDS = {
    "logs": _log_round, "search": _search_round, "article": _article_round,
    "json": _json_round, "code": _code_round, "tests": _tests_round,
}


def _round(rng, conv, kind, size, avoid, style):
    """The messages of one round and their estimated cost."""
    user, plan, intent, body, summary = ROUNDS[kind](rng, size, avoid)
    msgs = [("user", user, "user: asks for " + kind)] if style == "chat" else []
    msgs += [("assistant", plan, "plan: " + intent.split(":", 1)[1].strip()),
             ("tool", body, intent),
             ("assistant", summary, "plan: summarize " + kind)]
    return msgs, sum(conv.cost(m[1]) for m in msgs)


def add_rounds(rng: random.Random, conv: Conversation, budget: int, avoid: list[str],
               kinds: list[str] = tuple(ROUNDS), style: str = "chat",
               round_tokens: tuple[int, int] = (250, 1100)) -> None:
    """Appends distractor rounds to conv until about budget tokens were added.

    style "chat": a user request, the assistant's plan, the tool output, the
    assistant's summary. style "agent": no user turns, the assistant chains
    tool calls on its own.
    """
    goal = conv.tokens + budget
    # The turns around a tool output: user request, plan, summary, framing.
    overhead = 65 if style == "chat" else 45
    # Line-by-line outputs can be cut small; prose comes in whole paragraphs.
    fine = [k for k in kinds if k in ("logs", "json")] or list(kinds)
    while True:
        left = goal - conv.tokens
        if left < overhead + 25:
            return
        size = rng.randint(*round_tokens)
        kind = rng.choice(list(kinds))
        # A remainder too small for one more round goes into this one, or,
        # when this one is prose, into a line-by-line round after it.
        last = left - (size + overhead) < overhead + MIN_ROUND_TOKENS
        if last and kind not in fine and left - 2 * overhead - 150 >= 150:
            size, last = left - 2 * overhead - 150, False
        elif last:
            size, kind = left - overhead, rng.choice(fine)
        msgs, cost = _round(rng, conv, kind, size, avoid, style)
        # Outputs stop short of their budget by up to a paragraph; the last
        # round retries with the shortfall added so the task lands on target.
        for _ in range(4 if last else 0):
            short = left - cost
            if short < 10:
                break
            m2, c2 = _round(rng, conv, kind, size + short, avoid, style)
            while c2 > left + 5 and short > 10:
                short //= 2
                m2, c2 = _round(rng, conv, kind, size + short, avoid, style)
            if c2 > left + 5:
                break
            size, msgs, cost = size + short, m2, c2
        for role, content, intent in msgs:
            conv.add(role, content, intent=intent)
