"""Family `coding`: signatures and calls from source files read earlier.

The assistant reads source files (about three Python to one JavaScript) with
read_file; each file holds several generated functions with docstrings, and
names across the task are near misses of each other. A few test runs and log
checks sit between the reads. The final question is about one function
defined in the first half of the trace:

- "call": write a call with given argument values, which the user lists in a
  shuffled order, in the parameter order of the definition:
      Write the call to apply_discount with rate=0.1, cart=c, code='X', using
      the parameter order of its definition. Reply with the call only.
  Scoring "call": eval has "function", "args" (argument source in signature
  order) and "params" (the signature's names); the first call in the output
  must name the function and pass the same values in that order, positionally
  or as keywords.
- "signature": copy the function's declaration line. Scoring "contains" with
  answers ["def apply_discount(cart, code, rate)"] (or "function
  applyDiscount(...)" for JavaScript), whitespace-normalized.

Function bodies never call a public function, so the definition is the only
place the parameter order appears; "evidence" in eval holds that line.
"""

from __future__ import annotations

import random

import codegen
import filler
from common import Conversation, Task, fit_lines

FAMILY = "coding"
SYSTEM = ("You are a coding assistant working in the acme-shop repository. You can read files "
          "and run commands. When asked for code, reply with code only.")
OPENERS = [
    "I need to change how {noun} handling works. Read the relevant files first; I'll ask you "
    "something about them afterwards.",
    "Before we refactor, go through the {noun} code paths and get familiar with the helpers.",
    "There's a bug report about {noun} totals. Look through the source so you know the functions "
    "involved.",
]
TOKENS_PER_FUNC = 80


def _file_round(rng, conv, used, lang, budget, min_params):
    n = max(2, min(14, budget // TOKENS_PER_FUNC))
    path, body, funcs = codegen.source_file(rng, lang, used, n, min_params)
    while conv.cost(body) > budget + 40 and len(funcs) > 2:
        funcs = funcs[:-1]
        render = codegen.render_py if lang == "py" else codegen.render_js
        body = render(rng, path.rsplit("/", 1)[1].split(".")[0], funcs)
    if conv.cost(body) > budget + 40:
        body = fit_lines(body.split("\n"), budget)
        funcs = [f for f in funcs if f.signature() in body]
    conv.add("assistant", f"Reading {path}.", intent="plan: read_file " + path)
    conv.add("tool", body, intent="tool: read_file " + path)
    conv.add("assistant", f"{path} defines {len(funcs)} functions: "
             f"{', '.join(f.name for f in funcs[:3])}{' and others' if len(funcs) > 3 else ''}.",
             intent="plan: note the functions")
    return funcs


def _distinct_values(rng, params, lang):
    for _ in range(50):
        vals = [codegen.arg_value(rng, p, lang) for p in params]
        if len(set(vals)) == len(vals):
            return vals
    return [f"{p}_value" for p in params]


def generate(rng: random.Random, task_id: str, seed: int, target: int) -> Task:
    conv = Conversation()
    conv.add("system", SYSTEM)
    conv.add("user", rng.choice(OPENERS).format(noun=rng.choice(codegen.NOUNS)),
             intent="user: asks to read the code")
    variant = "call" if rng.random() < 0.6 else "signature"
    goal = target - 70  # about the question's size; a top-up below fixes the rest
    used: dict = {}
    candidates = []
    # File sizes fit the budget: a small task has two or three files, a big one many.
    need = 3 if variant == "call" else 2
    while True:
        left = goal - conv.tokens
        if left < 300:
            break
        size = min(left - 50, rng.randint(300, 900))
        if left - size < 300:
            size = left - 50  # the remainder would be too small for a file
        lang = "py" if rng.random() < 0.75 else "js"
        early = conv.tokens <= target // 2 or not candidates
        funcs = _file_round(rng, conv, used, lang, size, need if early else 1)
        if early:
            candidates += [f for f in funcs if len(f.params) >= need]
        left = goal - conv.tokens
        if left > 400 and rng.random() < 0.3:
            filler.add_rounds(rng, conv, min(left - 200, rng.randint(150, 450)), list(used),
                              ["tests", "logs", "search"], style="agent", round_tokens=(120, 400))
    if not candidates:
        raise RuntimeError(f"{task_id}: no candidate function; target {target} too small")
    f = rng.choice(candidates)
    if variant == "call":
        vals = _distinct_values(rng, f.param_names, f.lang)
        order = list(range(len(vals)))
        while order == sorted(order):
            rng.shuffle(order)
        given = ", ".join(f"{f.param_names[i]}={vals[i]}" for i in order)
        how = ("using the parameter order of its definition" if f.lang == "py" else
               "passing the values positionally in the parameter order of its definition")
        question = f"Write the call to {f.name} with {given}, {how}. Reply with the call only."
        ev = {"family": FAMILY, "scorer": "call", "function": f.name, "args": vals,
              "params": f.param_names, "answers": [f"{f.name}({', '.join(vals)})"],
              "evidence": [f.signature()], "lang": f.lang}
        max_new, intent = 48, "answer: write the call"
    else:
        what = "def line" if f.lang == "py" else "declaration line"
        question = (f"Copy the {what} of the function {f.name} exactly as it appears in the file. "
                    "Reply with that line only.")
        ev = {"family": FAMILY, "scorer": "contains", "answers": [f.signature()],
              "evidence": [f.signature()], "lang": f.lang}
        max_new, intent = 40, "answer: quote a function signature"
    # Whole functions leave a remainder; a log check fills it.
    filler.add_rounds(rng, conv, target - conv.tokens - conv.cost(question), list(used),
                      ["logs", "json"], style="agent", round_tokens=(60, 300))
    conv.add("user", question, intent="user: asks about a function")
    return Task(task_id, FAMILY, seed, conv, max_new, intent, ev)
