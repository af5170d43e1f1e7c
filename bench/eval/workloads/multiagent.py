"""Family `multiagent`: agents that share one long prompt prefix.

Each group is 16 agents (one task each) whose first message is the same
system prompt, byte for byte: the team's instructions, the JSON schemas of the
tools every agent may call, and working agreements (about 1500 tokens). After
it each agent has its own short conversation, built like a `recall` task
(facts in the first user turns, distractors after) or a `tools` task (an
incident and a tool trace, the detail noted by the assistant or not, as in
`tools`), and the final question is about that agent's own turns. Sizes,
prefix included, spread over the run's range; with --min-tokens under 1950
the prefix shrinks to min-tokens - 450 to leave each agent room.

eval carries "shared_prefix_messages" (how many leading messages all agents of
the group share, here 1), "group", "agent" and "kind" (recall or tools), so
the evaluation can run a group concurrently and account for a prefix the daemon
stores once. Scoring: "contains", as in recall and tools.

Groups: `--per-family N` gives N tasks, whole groups of 16 and, for a count
that is not a multiple of 16, the first agents of one more group (agent a of
a group is the same task whatever N is).
"""

from __future__ import annotations

import json
import random

import recall
import text
import tools
from common import Conversation, Task, answer_variants, est_tokens, size_targets, task_seed

FAMILY = "multiagent"
AGENTS_PER_GROUP = 16
PREFIX_TOKENS = 1500

TOOLS = [
    ("read_file", "Read a file from the repository and return its contents.",
     {"path": ("string", "Path relative to the repository root."),
      "start_line": ("integer", "First line to return, 1-based."),
      "max_lines": ("integer", "Maximum number of lines to return.")}, ["path"]),
    ("write_file", "Create or overwrite a file in the repository.",
     {"path": ("string", "Path relative to the repository root."),
      "content": ("string", "The full new content of the file.")}, ["path", "content"]),
    ("run_tests", "Run the test suite, or a subset of it, and return the runner output.",
     {"selector": ("string", "A pytest node id or keyword expression; empty runs everything."),
      "timeout_s": ("integer", "Give up after this many seconds.")}, []),
    ("tail_logs", "Return the most recent log lines of a service.",
     {"service": ("string", "Service name, for example billing or api-gateway."),
      "lines": ("integer", "How many lines to return."),
      "level": ("string", "Minimum level: DEBUG, INFO, WARN or ERROR.")}, ["service"]),
    ("http_get", "Call an internal HTTP API with GET and return the JSON body.",
     {"url": ("string", "Path of the endpoint, for example /v1/jobs?limit=20."),
      "headers": ("object", "Extra request headers.")}, ["url"]),
    ("search_kb", "Search the internal knowledge base and return ranked results.",
     {"query": ("string", "Free-text query."), "limit": ("integer", "Maximum number of results.")},
     ["query"]),
    ("fetch_url", "Fetch a web page and return its text.",
     {"url": ("string", "Absolute URL."), "mode": ("string", "raw or text.")}, ["url"]),
    ("query_db", "Run a read-only SQL query on the reporting replica.",
     {"sql": ("string", "A single SELECT statement."),
      "max_rows": ("integer", "Truncate the result after this many rows.")}, ["sql"]),
    ("create_ticket", "Open a ticket in the issue tracker.",
     {"title": ("string", "One-line summary."), "body": ("string", "Details, steps to reproduce."),
      "priority": ("string", "low, medium, high or urgent."),
      "assignee": ("string", "User name of the owner.")}, ["title", "body"]),
    ("send_message", "Post a message to a team channel.",
     {"channel": ("string", "Channel name without the #."), "text": ("string", "Message text.")},
     ["channel", "text"]),
    ("list_jobs", "List scheduler jobs with their status.",
     {"status": ("string", "Filter: queued, running, succeeded, failed or cancelled."),
      "since": ("string", "ISO 8601 timestamp.")}, []),
    ("get_metrics", "Return a time series from the metrics store.",
     {"name": ("string", "Metric name, for example http_requests_total."),
      "window": ("string", "Duration such as 15m or 24h."),
      "labels": ("object", "Label filters.")}, ["name"]),
    ("book_travel", "Search and hold flights and hotels for a traveller.",
     {"traveller": ("string", "Full name."), "origin": ("string", "City of departure."),
      "destination": ("string", "City of arrival."), "date": ("string", "YYYY-MM-DD.")},
     ["traveller", "destination", "date"]),
    ("lookup_order", "Return an order's status, items and shipping address.",
     {"order_id": ("string", "Order number such as ORD-12345.")}, ["order_id"]),
]


def shared_prefix(rng: random.Random, budget: int) -> str:
    """The group's system prompt, sized to about budget tokens."""
    team = rng.choice(["Acme operations", "Globex platform", "Initech support", "Umbrella billing"])
    head = (f"You are one of the agents of the {team} team. Several agents work in parallel; each "
            "handles its own requests and keeps its own notes. Use the tools below when you need "
            "data, keep answers short, and copy ids, names, dates, file names and line numbers "
            "exactly as they appear.\n\n# Tools\n")
    tools_ = list(TOOLS)
    rng.shuffle(tools_)
    schemas = []
    used = est_tokens(head) + 10
    for name, desc, props, req in tools_:
        schema = json.dumps({"name": name, "description": desc, "parameters": {
            "type": "object", "required": req,
            "properties": {p: {"type": t, "description": d} for p, (t, d) in props.items()}}})
        # Only a small --min-tokens leaves too little room for every tool.
        if used + est_tokens(schema) > budget and len(schemas) >= 3:
            break
        schemas.append(schema)
        used += est_tokens(schema) + 2
    body = head + "\n".join(schemas) + "\n\n# Working agreements\n"
    used = est_tokens(body)
    notes = []
    while True:
        s = text.fill_sentence(rng, rng.choice(text.SENTENCES))
        cost = est_tokens(s) + 1
        if used + cost > budget:
            break
        notes.append(s[0].upper() + s[1:])
        used += cost
    return body + " ".join(notes)


def generate_group(run_seed: int, group: int, lo: int, hi: int) -> list[Task]:
    grng = random.Random(task_seed(run_seed, FAMILY, 10_000 + group))
    # Small --min-tokens only: leave each agent room for its own turns.
    prefix = shared_prefix(grng, min(PREFIX_TOKENS, lo - 450))
    targets = size_targets(run_seed, f"{FAMILY}-g{group}", AGENTS_PER_GROUP, lo, hi)
    tasks = []
    for a in range(AGENTS_PER_GROUP):
        seed = task_seed(run_seed, FAMILY, group * AGENTS_PER_GROUP + a)
        rng = random.Random(seed)
        task_id = f"{FAMILY}-g{group:02d}-a{a:02d}"
        conv = Conversation()
        conv.add("system", prefix)
        budget = targets[a] - conv.tokens
        extra = {}
        if rng.random() < 0.5:
            question, answer, answer_prefix = recall.build_turns(rng, conv, budget)
            kind = "recall"
        else:
            extra["noted"] = rng.random() < 0.5
            question, answer, answer_prefix, _ = tools.build_turns(rng, conv, budget, noted=extra["noted"])
            kind = "tools"
        conv.add("user", question, intent="user: asks about an earlier detail")
        tasks.append(Task(task_id, FAMILY, seed, conv, 24, "answer: recall a detail from this agent's turns",
                          {"family": FAMILY, "scorer": "contains", "answers": answer_variants(answer),
                           "shared_prefix_messages": 1, "group": group, "agent": a, "kind": kind,
                           **extra},
                          {"group": group}, answer_prefix=answer_prefix))
    return tasks
