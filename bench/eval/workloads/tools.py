"""Family `tools`: one detail out of a long agent tool trace.

The user reports an incident; the assistant then chains tool calls on its own
(short decision turns between long outputs): service logs, JSON API
responses, a Java service log with a stack trace, a pytest run, plus
distractor searches, blog posts and file reads. One "key" output sits in the
first part of the trace and the final question asks for one detail of it:

- the request id of the only request that failed with a 5xx status;
- the File.java:line where the only Java exception was thrown;
- the path:line that raised the only Python exception in the test run;
- the name of the only failing test;
- the id of the only job whose status is "failed".

Each key kind occurs at most once per task (distractor logs carry no 5xx,
distractor test runs pass, distractor listings hold no jobs), so the answer is
unambiguous and occurs verbatim in the context. In half of the tasks ("noted":
true in eval) the assistant's short note after the key output repeats the
detail, as an agent writing down what it found would; in the other half the
notes say that something failed but not the answer, which then lives only in
the long tool output. The 135M model rarely finds a detail buried in a long
output even with the full cache; a noted one it copies more often, and
whether a cache policy keeps such short assistant turns is worth measuring.
The answer_prefix starts the reply, with the id's fixed part where there is
one ("The failed job is job-"), so the model's first tokens are the copy.
Scoring: "contains", with the id's core as a second answer ("req-8f3a2c91",
"8f3a2c91").
"""

from __future__ import annotations

import json
import random

import filler
import text
from common import Conversation, Task, answer_variants, est_tokens

FAMILY = "tools"
SYSTEM = ("You are a debugging agent. You can read logs, call HTTP APIs, run tests and read "
          "files. Be brief, and quote ids, file names and line numbers exactly.")
INCIDENTS = [
    "The nightly billing export failed around 02:00 and customers report errors at checkout. "
    "Investigate with your tools and tell me what you find.",
    "Support says invoices stopped generating this morning. Please dig into the services and "
    "the test suite and find out what broke.",
    "Our error budget alert fired for the payments path an hour ago. Look around and collect "
    "the evidence before we write the incident report.",
    "The release candidate is blocked: something in staging is failing. Go through the logs, "
    "jobs and tests and report back.",
]
# Distractor kinds that cannot hold a second copy of any key detail.
FILLER_KINDS = ["logs", "search", "article", "json", "code", "tests"]


def _a(word: str) -> str:
    return ("an " if word[0].lower() in "aeiou" else "a ") + word


def _ts_of(line: str) -> str:
    return line.split(" ", 1)[0]


def key_log5xx(rng: random.Random, size: int, avoid: list[str]):
    service = rng.choice(text.SERVICES)
    rid = text.request_id(rng)
    status = rng.choice([500, 502, 503, 504])
    lines = text.server_log(rng, size - 40, service, avoid + [rid], min_lines=4)
    at = rng.randrange(len(lines) // 3, max(len(lines) // 3 + 1, len(lines) - 2))
    ts = _ts_of(lines[at])
    upstream = rng.choice([s for s in text.SERVICES if s != service])
    lines[at + 1:at + 1] = [
        text.log_line(rng, ts, service, status, rid),
        f"{ts} ERROR {service} req={rid} upstream {upstream} failed after 3 retries: "
        f"{'connection reset by peer' if status != 504 else 'deadline exceeded'}",
    ]
    return (f"Checking the {service} logs around the time of the incident.",
            f"tool: tail_logs {service}", "\n".join(lines),
            (f"One request in the {service} logs failed with status {status} because {upstream} "
             f"did not answer; everything else succeeded.",
             f"Request {rid} failed with status {status} because {upstream} did not answer; "
             "everything else succeeded."),
            f"In the {service} logs, what is the request id of the request that failed with status "
            f"{status}? Answer with the request id only.", rid,
            f"The request that failed with status {status} is req-")


def key_java(rng: random.Random, size: int, avoid: list[str]):
    service = rng.choice(["ledger", "billing-jvm", "orders-jvm", "sync-worker"])
    exc = rng.choice(text.JAVA_EXCEPTIONS)
    trace, where = text.java_trace(rng, exc, rng.randint(6, 11))
    short = exc.rsplit(".", 1)[1]
    lines = text.server_log(rng, size - est_tokens(trace) - 30, service, avoid + [where], min_lines=4)
    at = rng.randrange(len(lines) // 3, max(len(lines) // 3 + 1, len(lines) - 1))
    lines[at + 1:at + 1] = [f"{_ts_of(lines[at])} ERROR {service} [worker-{rng.randint(1, 8)}] "
                            f"Unhandled exception while processing batch {rng.randint(100, 999)}",
                            trace]
    return (f"Reading the {service} service log.",
            f"tool: tail_logs {service}", "\n".join(lines),
            (f"The {service} service crashed with {_a(short)} while processing a batch.",
             f"The {service} service crashed with {_a(short)} thrown at {where}."),
            f"In the {service} log, at which file and line was the {short} thrown? Answer in the "
            f"form File.java:line only.", where, f"The {short} was thrown at")


def _pytest_key(rng, size, avoid):
    test = text.test_names(rng, 1, avoid)[0]
    exc = rng.choice(text.PY_EXCEPTIONS)
    body, where = text.python_failure(rng, test, exc)
    n = max(6, (size - 80 - sum(est_tokens(l) + 2 for l in body)) // 22)
    run = text.pytest_run(rng, n, test, body, avoid + [where])
    return test, exc, run, where


def key_pytest_where(rng: random.Random, size: int, avoid: list[str]):
    test, exc, run, where = _pytest_key(rng, size, avoid)
    return ("Running the test suite.", "tool: run_tests", run,
            (f"One test fails with {_a(exc[0])}; the others pass.",
             f"One test fails with {_a(exc[0])} raised at {where}; the others pass."),
            f"In the test run, which file and line raised the {exc[0]}? Answer in the form "
            f"path:line only.", where, f"The {exc[0]} was raised at src/")


def key_pytest_name(rng: random.Random, size: int, avoid: list[str]):
    test, exc, run, where = _pytest_key(rng, size, avoid)
    return ("Running the test suite.", "tool: run_tests", run,
            (f"Exactly one test fails, with {_a(exc[0])}.",
             f"Exactly one test fails: {test[1]}, with {_a(exc[0])}."),
            "Which test failed in the test run? Answer with the test function name only.", test[1],
            "The failing test is test_")


def key_jobs(rng: random.Random, size: int, avoid: list[str]):
    names = ["export-invoices", "sync-ledger", "rebuild-search-index", "send-reminders",
             "compact-audit-log", "refresh-exchange-rates", "archive-sessions", "daily-report"]
    n = max(5, (size - 20) // 75)
    ids = rng.sample(range(1000, 9999), n)
    failed = rng.randrange(n)
    recs = []
    for i, jid in enumerate(ids):
        status = "failed" if i == failed else rng.choice(
            ["succeeded", "succeeded", "running", "queued", "cancelled"])
        rec = {"id": f"job-{jid}", "name": rng.choice(names), "status": status,
               "started_at": f"2024-05-{rng.randint(1, 28):02d}T0{rng.randint(0, 9)}:"
                             f"{rng.randint(10, 59)}:00Z",
               "attempts": 3 if status == "failed" else rng.randint(1, 2)}
        recs.append(json.dumps(rec))
    body = '{"jobs": [\n  ' + ",\n  ".join(recs) + f'\n], "total": {n}}}'
    return ("Listing the scheduler's recent jobs.", "tool: http_get /v1/jobs?limit=" + str(n), body,
            ("One job in the list has failed after 3 attempts; the others are fine.",
             f"Job job-{ids[failed]} has failed after 3 attempts; the others are fine."),
            "In the jobs API response, what is the id of the job whose status is failed? Answer "
            "with the job id only.", f"job-{ids[failed]}", "The failed job is job-")


KEYS = {"log5xx": key_log5xx, "java": key_java, "pytest_where": key_pytest_where,
        "pytest_name": key_pytest_name, "jobs": key_jobs}


def build_turns(rng: random.Random, conv: Conversation, budget: int, style: str = "agent",
                noted: bool = False) -> tuple[str, str, str, str]:
    """Adds an incident, key outputs and distractors (about budget tokens).

    noted: the assistant's note after the asked output repeats the answer.
    Returns (question, answer, answer_prefix, key kind). Shared with the multiagent family.
    """
    goal = conv.tokens + budget
    conv.add("user", rng.choice(INCIDENTS), intent="user: reports an incident")
    asked = rng.choice(list(KEYS))
    # The two pytest keys would both need a failing run; keep one.
    others = [k for k in KEYS if k != asked and not (k.startswith("pytest") and asked.startswith("pytest"))]
    if "pytest_where" in others and "pytest_name" in others:
        others.remove(rng.choice(["pytest_where", "pytest_name"]))
    room = goal - conv.tokens - 60
    num_keys = max(1, min(1 + len(others), room // 700))
    keys = [asked] + rng.sample(others, num_keys - 1)
    # The asked output goes first or second, so that most of the trace follows it.
    if num_keys > 1 and rng.random() < 0.5:
        keys[0], keys[1] = keys[1], keys[0]
    key_size = min(900, max(250, room // (num_keys + 1)))
    answer = question = None
    avoid: list[str] = []
    for i, k in enumerate(keys):
        plan, intent, body, (buried, with_answer), q, a, p = KEYS[k](rng, key_size, list(avoid))
        conv.add("assistant", plan, intent="plan: " + intent.split(":", 1)[1].strip())
        conv.add("tool", body, intent=intent)
        conv.add("assistant", with_answer if noted and k == asked else buried,
                 intent="plan: note the failure")
        avoid.append(a)
        if k == asked:
            question, answer, prefix = q, a, p
        pending = len(keys) - 1 - i
        left = goal - conv.tokens - 30 - pending * (key_size + 70)
        share = left // (pending + 1)
        # A passing rerun after a failing one would contradict it.
        kinds = [f for f in FILLER_KINDS if f != "tests" or not any(x.startswith("pytest") for x in keys)]
        filler.add_rounds(rng, conv, share, avoid, kinds, style=style)
    return question, answer, prefix, asked


def generate(rng: random.Random, task_id: str, seed: int, target: int) -> Task:
    conv = Conversation()
    conv.add("system", SYSTEM)
    noted = rng.random() < 0.5
    question, answer, prefix, kind = build_turns(rng, conv, target - conv.tokens, noted=noted)
    conv.add("user", question, intent="user: asks about a tool output")
    return Task(task_id, FAMILY, seed, conv, 24, "answer: report one detail from the tool outputs",
                {"family": FAMILY, "scorer": "contains", "answers": answer_variants(answer),
                 "detail": kind, "noted": noted}, answer_prefix=prefix)
