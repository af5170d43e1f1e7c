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
place the parameter order appears; "evidence" in eval holds that line. The
answer_prefix opens the reply ("apply_discount(" or "def apply_discount("),
so the model goes straight to the arguments.
"""

from __future__ import annotations

import random

import codegen
import filler
from common import Conversation, Task

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


def _file_round(rng, conv, used, lang, budget, min_params, exact=False):
    """Reads one new file; returns the functions shown.

    The file is about budget tokens of whole functions; with exact, the
    whole round (plan, output, note) is cut to budget tokens at a line, the
    way a read_file with a line limit stops.
    """
    n = max(2, min(16, budget // TOKENS_PER_FUNC + (2 if exact else 0)))
    path, body, funcs = codegen.source_file(rng, lang, used, n, min_params)
    render = codegen.render_py if lang == "py" else codegen.render_js
    while not exact and conv.cost(body) > budget + 40 and len(funcs) > 2:
        funcs = funcs[:-1]
        body = render(rng, path.rsplit("/", 1)[1].split(".")[0], funcs)
    plan = f"Reading {path}."

    def note(fs):
        names = ", ".join(f.name for f in fs[:3]) + (" and others" if len(fs) > 3 else "")
        return f"{path} defines {len(fs)} functions: {names}."

    if exact:
        lines = body.rstrip("\n").split("\n")
        marker = ("# " if lang == "py" else "// ") + "[read_file: output truncated]"

        def cut(k):
            b = "\n".join(lines[:k]) + ("\n" + marker if k < len(lines) else "")
            fs = [f for f in funcs if f.signature() in b]
            return b, fs, conv.cost(plan) + conv.cost(b) + conv.cost(note(fs))

        lo, hi = 1, len(lines)  # the most lines whose round fits in budget
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if cut(mid)[2] <= budget:
                lo = mid
            else:
                hi = mid - 1
        body, funcs, _ = cut(lo)
    conv.add("assistant", plan, intent="plan: read_file " + path)
    conv.add("tool", body, intent="tool: read_file " + path)
    conv.add("assistant", note(funcs), intent="plan: note the functions")
    return funcs


def _distinct_values(rng, params, lang):
    for _ in range(50):
        vals = [codegen.arg_value(rng, codegen.snake(p), lang) for p in params]
        if len(set(vals)) == len(vals):
            return vals
    return [f"{p}_value" for p in params]


def _question(rng, variant, f):
    """(question, eval, max_new_tokens, intent, answer_prefix) about function f."""
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
        return question, ev, 48, "answer: write the call", f"{f.name}("
    what = "def line" if f.lang == "py" else "declaration line"
    question = (f"Copy the {what} of the function {f.name} exactly as it appears in the file. "
                "Reply with that line only.")
    ev = {"family": FAMILY, "scorer": "contains", "answers": [f.signature()],
          "evidence": [f.signature()], "lang": f.lang}
    return (question, ev, 40, "answer: quote a function signature",
            ("def " if f.lang == "py" else "function ") + f.name + "(")


def generate(rng: random.Random, task_id: str, seed: int, target: int) -> Task:
    conv = Conversation()
    conv.add("system", SYSTEM)
    conv.add("user", rng.choice(OPENERS).format(noun=rng.choice(codegen.NOUNS)),
             intent="user: asks to read the code")
    variant = "call" if rng.random() < 0.6 else "signature"
    need = 3 if variant == "call" else 2
    used: dict = {}
    candidates: list = []
    asked = None  # (question, eval, max_new_tokens, intent), fixed once half the files are read
    goal = target - 70  # until the question, and so its size, is known
    # File sizes fit the budget: a small task has two or three files, a big one many.
    while True:
        if asked is None and candidates and conv.tokens >= target // 2:
            asked = _question(rng, variant, rng.choice(candidates))
            goal = target - conv.cost(asked[0])
        left = goal - conv.tokens
        if left < 120:
            break
        size = min(left - 50, rng.randint(300, 900))
        lang = "py" if rng.random() < 0.75 else "js"
        early = asked is None
        # The last file is cut to the remainder instead of leaving it empty.
        exact = not early and left - size < 300
        funcs = _file_round(rng, conv, used, lang, left if exact else size,
                            need if early else 1, exact)
        if early:
            candidates += [f for f in funcs if len(f.params) >= need]
        if exact:
            break
        left = goal - conv.tokens
        if left > 600 and rng.random() < 0.3:
            filler.add_rounds(rng, conv, min(left - 450, rng.randint(150, 450)), list(used),
                              ["tests", "logs", "search"], style="agent", round_tokens=(120, 400))
    if asked is None:
        if not candidates:
            raise RuntimeError(f"{task_id}: no candidate function; target {target} too small")
        asked = _question(rng, variant, rng.choice(candidates))
    question, ev, max_new, intent, prefix = asked
    conv.add("user", question, intent="user: asks about a function")
    return Task(task_id, FAMILY, seed, conv, max_new, intent, ev, answer_prefix=prefix)
