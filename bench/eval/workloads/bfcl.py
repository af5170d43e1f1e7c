"""Family `bfcl`: the next function calls of a BFCL multi-turn conversation.

Data: the Berkeley Function Calling Leaderboard's multi-turn base category
from the PyPI wheel bfcl-eval (fetched by bench/eval/data.py, never imported):
BFCL_v4_multi_turn_base.json (questions, per-turn user messages, involved API
classes, initial environment state), possible_answer/ of the same name
(ground-truth calls per turn) and multi_turn_func_doc/*.json (the function
schemas of each API class).

Task: one conversation, cut at a turn k >= 1 whose ground-truth argument
values all occur in the context (we do not execute the APIs, so a value only
an API result would reveal cannot be copied; 168 of the 200 conversations
have such a turn); turns with a single call are preferred, at most three. The system prompt
holds BFCL's function-calling instruction, the schemas of the involved
classes (descriptions without BFCL's per-class boilerplate, no response
schemas) and the initial state; turns 0..k-1 follow as user message, the
ground-truth calls as assistant content ("[cd(folder='docs'), ls()]") and a
short simulated tool result (we do not execute the APIs, so results are a
plain "ok" and later turns read as if each call succeeded). Turn k's user
message is the question and its ground-truth calls are the answer.

Sizing: functions of the involved classes that no call up to turn k uses are
dropped when the task is over its size target; schemas of unrelated classes
(shuffled in among the real ones, like BFCL's "multiple" category) pad it
when under.

The answer_prefix "[" opens the call list the instruction asks for.

Scoring "call": eval "calls" is [{"function", "kwargs"}] in order, "params"
maps each function to its parameter order (for positional arguments in the
output) and "defaults" to its documented defaults. The first len(calls)
calls found in the output must match by name and argument values (strings
compared stripped of quotes, numbers numerically; a kwarg equal to its
default may be given or omitted); calls after them are ignored.
"""

from __future__ import annotations

import ast
import json
import os
import random

import data
from common import HARD_CAP_TOKENS, Conversation, Task, problem_split, task_seed

FAMILY = "bfcl"
CLASS_DOCS = {
    "GorillaFileSystem": "gorilla_file_system.json", "MathAPI": "math_api.json",
    "MessageAPI": "message_api.json", "TwitterAPI": "posting_api.json",
    "TicketAPI": "ticket_api.json", "TradingBot": "trading_bot.json",
    "TravelAPI": "travel_booking.json", "VehicleControlAPI": "vehicle_control.json",
}
INSTRUCTION = (
    "You are an expert in composing functions. You are given a question and a set of possible "
    "functions. Based on the question, you will need to make one or more function calls to "
    "achieve the purpose. You should only return the function calls in your response, in the "
    "format [func_name1(param_name1=value1, param_name2=value2), func_name2(param=value)], with "
    "no other text.\n\nHere is a list of functions in JSON format that you can invoke:\n")


def _load_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(l) for l in f if l.strip()]


def load(data_dir: str) -> dict:
    paths = data.require(data_dir, "bfcl")
    answers = {a["id"]: a["ground_truth"] for a in _load_jsonl(paths["bfcl_multi_turn_answers"])}
    docs = {}
    for cls, fname in CLASS_DOCS.items():
        docs[cls] = _load_jsonl(os.path.join(paths["bfcl_func_doc"], fname))
    entries = [q for q in _load_jsonl(paths["bfcl_multi_turn"]) if q["id"] in answers]
    return {"entries": entries, "answers": answers, "docs": docs,
            "source": os.path.basename(paths["bfcl_multi_turn"])}


def compact_doc(doc: dict) -> dict:
    desc = doc["description"].split("Tool description: ", 1)[-1].strip()
    return {"name": doc["name"], "description": desc, "parameters": doc["parameters"]}


def parse_call(src: str, docs_by_name: dict) -> dict | None:
    """{"function", "kwargs"} of a ground-truth call, positional args named."""
    try:
        node = ast.parse(src.strip(), mode="eval").body
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            return None
        name = node.func.id
        if name not in docs_by_name:
            return None
        order = list(docs_by_name[name]["parameters"]["properties"])
        kwargs = {}
        for i, a in enumerate(node.args):
            kwargs[order[i]] = ast.literal_eval(a)
        for k in node.keywords:
            kwargs[k.arg] = ast.literal_eval(k.value)
        return {"function": name, "kwargs": kwargs}
    except (SyntaxError, ValueError, IndexError):
        return None


def _leaves(v):
    if isinstance(v, (list, tuple)):
        for x in v:
            yield from _leaves(x)
    elif isinstance(v, dict):
        for x in v.values():
            yield from _leaves(x)
    elif not isinstance(v, bool) and v is not None:
        yield str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)


def _candidate_turns(entry, gt, docs_by_name):
    """Turns k >= 1 whose calls all parse and can be copied from the context.

    Values the real APIs would have returned (a booking id, say) are not in
    our context, since we do not execute the calls; turns that need one are
    skipped.
    """
    ok = []
    for k in range(1, len(gt)):
        calls = [parse_call(c, docs_by_name) for c in gt[k]]
        if not (1 <= len(calls) <= 3 and all(calls)):
            continue
        seen = " ".join([json.dumps(entry["initial_config"])] +
                        [m["content"] for t in entry["question"][:k + 1] for m in t] +
                        [c for t in gt[:k] for c in t]).lower()
        if all(v.lower() in seen for c in calls for v in _leaves(c["kwargs"])):
            ok.append((k, calls))
    return ok


def _docs_by_name(ds, entry):
    if not all(c in ds["docs"] for c in entry["involved_classes"]):
        return None
    return {d["name"]: d for c in entry["involved_classes"] for d in ds["docs"][c]}


def _call_list(calls: list[str]) -> str:
    return "[" + ", ".join(c.strip() for c in calls) + "]"


def generate(rng: random.Random, task_id: str, seed: int, target: int, ctx: dict) -> Task:
    cache = ctx["cache"]
    if "bfcl" not in cache:
        ds = cache["bfcl"] = load(ctx["data_dir"])
        # One permutation of the usable conversations per run, so the tasks of
        # a run are distinct conversations while there are enough.
        order = [i for i, e in enumerate(ds["entries"])
                 if problem_split(e["id"]) == ctx["split"]
                 and (d := _docs_by_name(ds, e)) and _candidate_turns(e, ds["answers"][e["id"]], d)]
        random.Random(task_seed(ctx["run_seed"], FAMILY, -2)).shuffle(order)
        cache["bfcl_order"] = order
    ds, order = cache["bfcl"], cache["bfcl_order"]
    if not order:
        raise RuntimeError("no usable BFCL multi-turn conversation")
    entry = ds["entries"][order[ctx["index"] % len(order)]]
    classes = entry["involved_classes"]
    docs_by_name = _docs_by_name(ds, entry)
    gt = ds["answers"][entry["id"]]
    turns = _candidate_turns(entry, gt, docs_by_name)
    single = [t for t in turns if len(t[1]) == 1]
    pick = rng.choice(single if single and rng.random() < 0.8 else turns)
    k, expected = pick
    used = {c["function"] for t in gt[:k + 1] for c in (parse_call(s, docs_by_name) for s in t) if c}
    max_new = 48 if len(expected) == 1 else min(128, 40 * len(expected))

    def build(funcs: list[dict], with_state: bool) -> Conversation:
        conv = Conversation()
        system = INSTRUCTION + "\n".join(json.dumps(compact_doc(d)) for d in funcs)
        if with_state:
            system += ("\n\nInitial state of the environment:\n" +
                       json.dumps(entry["initial_config"]))
        conv.add("system", system)
        for t in range(k):
            user = " ".join(m["content"] for m in entry["question"][t] if m["role"] == "user")
            conv.add("user", user, intent="user: asks for an action")
            conv.add("assistant", _call_list(gt[t]), intent="plan: call the tools")
            results = [{"function": c.split("(", 1)[0].strip(), "result": "ok"} for c in gt[t]]
            conv.add("tool", json.dumps(results), intent="tool: results")
        final = " ".join(m["content"] for m in entry["question"][k] if m["role"] == "user")
        conv.add("user", final, intent="user: asks for the next action")
        return conv

    funcs = [d for c in classes for d in ds["docs"][c]]
    rng.shuffle(funcs)
    with_state = True
    conv = build(funcs, with_state)
    # Over target: drop functions nobody calls, then the state dump.
    spare = [d for d in funcs if d["name"] not in used]
    rng.shuffle(spare)
    while conv.tokens > target and spare:
        drop = spare.pop()
        funcs = [d for d in funcs if d is not drop]
        conv = build(funcs, with_state)
    if conv.tokens + max_new > HARD_CAP_TOKENS - 100:
        with_state = False
        conv = build(funcs, with_state)
    # Under target: schemas of other classes as distractors.
    others = [d for c in ds["docs"] if c not in classes for d in ds["docs"][c]
              if d["name"] not in docs_by_name]
    rng.shuffle(others)
    names = {d["name"] for d in funcs}
    for d in others:
        if conv.tokens >= target:
            break
        if d["name"] in names:
            continue
        trial = list(funcs)
        trial.insert(rng.randrange(len(trial) + 1), d)
        c2 = build(trial, with_state)
        if c2.tokens > target + 60:
            continue
        funcs, conv = trial, c2
        names.add(d["name"])
    wanted = sorted({c["function"] for c in expected})
    ev = {
        "family": FAMILY, "scorer": "call", "calls": expected,
        "params": {n: list(docs_by_name[n]["parameters"]["properties"]) for n in wanted},
        "defaults": {n: {p: v["default"] for p, v in docs_by_name[n]["parameters"]["properties"].items()
                         if "default" in v} for n in wanted},
        "answers": [_call_list(gt[k])], "bfcl_id": entry["id"], "bfcl_turn": k,
        "bfcl_source": ds["source"],
    }
    return Task(task_id, FAMILY, seed, conv, max_new, "answer: emit the function calls", ev,
                answer_prefix="[")
