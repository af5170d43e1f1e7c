"""Seeded source files (Python and JavaScript) full of plausible functions.

Function names come from a small verb x noun grid, so a file holds near
misses (apply_discount, apply_discounts, compute_discount): finding the right
definition needs the exact name, which is what a compressed cache tends to
blur. Bodies only call private helpers (leading underscore), never another
public function, so a function's parameter order is stated once, in its
definition.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

VERBS = [
    "apply", "compute", "load", "parse", "build", "validate", "normalize", "render", "fetch",
    "merge", "resolve", "format", "export", "schedule", "refund", "split", "sync", "reserve",
    "cancel", "estimate", "archive", "publish", "score", "rank", "encode", "summarize",
]
NOUNS = [
    "discount", "invoice", "cart", "session", "shipment", "coupon", "report", "ledger",
    "order", "payment", "tax", "receipt", "quote", "catalog", "price", "refund", "token",
    "batch", "profile", "address", "inventory", "schedule", "subscription", "webhook",
]
# name -> kind of value a caller passes; the kind picks example argument values.
PARAMS = {
    "cart": "ident", "code": "str", "rate": "float", "user_id": "int", "limit": "int",
    "timeout": "float", "retries": "int", "items": "ident", "path": "str", "encoding": "str",
    "strict": "bool", "currency": "str", "amount": "float", "region": "str", "session": "ident",
    "token": "str", "order": "ident", "invoice_id": "str", "page": "int", "page_size": "int",
    "verbose": "bool", "locale": "str", "tax_rate": "float", "max_age": "int",
    "callback": "ident", "batch_size": "int", "dry_run": "bool", "tenant": "str",
    "start_date": "str", "end_date": "str", "fmt": "str", "threshold": "float", "key": "str",
    "client": "ident", "level": "int", "label": "str", "sep": "str", "customer": "ident",
    "quantity": "int", "sku": "str", "weight": "float", "priority": "int", "note": "str",
}
STR_VALUES = {
    "code": ["SPRING24", "WELCOME10", "VIP-7"],
    "path": ["/tmp/out.csv", "data/orders.json", "exports/q3.xlsx"],
    "encoding": ["utf-8", "latin-1"], "currency": ["EUR", "USD", "JPY"], "region": ["eu-west-1", "us-east-2"],
    "token": ["tk_91ab", "abc123"], "invoice_id": ["INV-20931", "INV-77310"], "locale": ["de_DE", "pt_BR"],
    "tenant": ["acme", "globex"], "start_date": ["2024-03-01", "2023-11-15"],
    "end_date": ["2024-03-31", "2024-01-10"],
    "fmt": ["csv", "json", "pdf"], "key": ["sku", "created_at"], "label": ["nightly", "hotfix"],
    "sep": [",", ";"], "sku": ["SKU-4410", "SKU-0932"], "note": ["gift", "rush"],
}
IDENT_VALUES = {
    "cart": ["c", "cart", "basket"], "items": ["rows", "line_items", "items"], "session": ["sess", "s"],
    "order": ["o", "order"], "callback": ["on_done", "print"], "client": ["http", "api_client"],
    "customer": ["cust", "alice"],
}
DOC_TEMPLATES = [
    "{Verb} the {noun} for the given {p0}.",
    "{Verb} a {noun} and return the updated {p0}.",
    "{Verb} every {noun} that belongs to {p0}.",
    "Helper that will {verb} the {noun}; used by the nightly job.",
    "{Verb} the {noun} in place and log what changed.",
]


@dataclass
class Func:
    name: str                      # as written in the language (snake or camel case)
    params: list[tuple[str, str | None]]  # (name, default source or None)
    doc: str
    lang: str

    @property
    def param_names(self) -> list[str]:
        return [p for p, _ in self.params]

    def signature(self) -> str:
        """The declaration line as it appears in the file, without ':' or ' {'."""
        joined = ", ".join(p if d is None else (f"{p}={d}" if self.lang == "py" else f"{p} = {d}")
                           for p, d in self.params)
        kw = "def" if self.lang == "py" else "function"
        return f"{kw} {self.name}({joined})"


def camel(snake: str) -> str:
    head, *rest = snake.split("_")
    return head + "".join(w.capitalize() for w in rest)


def snake(name: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in name)


def arg_value(rng: random.Random, param: str, lang: str = "py") -> str:
    """Source text of an argument value a caller might pass for param."""
    kind = PARAMS.get(param, "ident")
    if kind == "str":
        return repr(rng.choice(STR_VALUES.get(param, ["x"])))
    if kind == "int":
        return str(rng.choice([1, 2, 3, 5, 10, 25, 50, 100, 250, 1000]))
    if kind == "float":
        return rng.choice(["0.1", "0.25", "1.5", "2.0", "0.07", "19.99", "30.0"])
    if kind == "bool":
        if lang == "py":
            return rng.choice(["True", "False"])
        return rng.choice(["true", "false"])
    return rng.choice(IDENT_VALUES.get(param, [param]))


def make_function(rng: random.Random, lang: str, used: dict, min_params: int = 1) -> Func:
    """A new function whose name is not in used (and records it there)."""
    while True:
        verb, noun = rng.choice(VERBS), rng.choice(NOUNS)
        if rng.random() < 0.2:
            noun = (noun[:-1] + "ies" if noun.endswith("y") else
                    noun + "es" if noun.endswith(("s", "x", "ch")) else noun + "s")
        snake = f"{verb}_{noun}"
        name = snake if lang == "py" else camel(snake)
        if name not in used:
            break
    used[name] = True
    names = rng.sample(list(PARAMS), rng.randint(max(min_params, 1), 5))
    params: list[tuple[str, str | None]] = []
    for i, p in enumerate(names):
        # Defaults only on a trailing parameter, as the languages require.
        default = None
        if i == len(names) - 1 and i >= 2 and rng.random() < 0.3:
            default = arg_value(rng, p, lang)
        params.append((p if lang == "py" else camel(p), default))
    tmpl = rng.choice(DOC_TEMPLATES)
    doc = tmpl.format(Verb=verb.capitalize(), verb=verb, noun=noun, p0=params[0][0])
    return Func(name if lang == "py" else camel(snake), params, doc, lang)


def py_body(rng: random.Random, f: Func, helpers: list[str]) -> list[str]:
    p = f.param_names
    out = []
    if rng.random() < 0.6:
        out += [f"    if not {p[0]}:", f"        raise ValueError(\"{p[0]} is required\")"]
    if len(p) > 1 and rng.random() < 0.5:
        out += [f"    for entry in {_helper(rng, helpers)}({p[0]}):",
                f"        entry.update({p[1]}={p[1]})"]
    choice = rng.randrange(3)
    if choice == 0:
        out.append(f"    result = {_helper(rng, helpers)}({', '.join(p[:2])})")
        out.append("    return result")
    elif choice == 1:
        pairs = ", ".join(f'"{x}": {x}' for x in p[:3])
        out.append(f"    return {{{pairs}}}")
    else:
        out.append(f"    total = sum(_amount(x) for x in {_helper(rng, helpers)}({p[0]}))")
        out.append(f"    return round(total, {rng.choice([2, 4])})")
    return out


def js_body(rng: random.Random, f: Func, helpers: list[str]) -> list[str]:
    p = f.param_names
    out = []
    if rng.random() < 0.6:
        out += [f"  if (!{p[0]}) {{", f"    throw new Error('{p[0]} is required');", "  }"]
    if rng.random() < 0.5:
        out.append(f"  const rows = {camel(_helper(rng, helpers).lstrip('_'))}({p[0]});")
        out.append(f"  return rows.map((r) => ({{ ...r, {', '.join(p[1:3]) or 'ok: true'} }}));")
    else:
        out.append(f"  return {{ {', '.join(p[:3])} }};")
    return out


def _helper(rng: random.Random, helpers: list[str]) -> str:
    return rng.choice(helpers)


HELPERS = ["_rows", "_lookup", "_group_by_day", "_with_retry", "_fetch_all", "_chunked", "_dedupe"]


def render_py(rng: random.Random, module: str, funcs: list[Func]) -> str:
    title = module.replace("_", " ").capitalize()
    lines = [f'"""{title}: helpers used by the API handlers and the nightly jobs."""', ""]
    lines += rng.sample(["import datetime", "import json", "import logging", "import math",
                         "from decimal import Decimal", "from typing import Any"], 3)
    lines += ["", f"from .util import {', '.join(rng.sample(HELPERS, 3))}, _amount", "",
              "log = logging.getLogger(__name__)", ""]
    for f in funcs:
        lines += ["", f"{f.signature()}:", f'    """{f.doc}"""']
        lines += py_body(rng, f, HELPERS)
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def render_js(rng: random.Random, module: str, funcs: list[Func]) -> str:
    lines = [f"// {module}.js: client-side helpers for the {module.replace('_', ' ')} screens.", "",
             "import { rows, lookup, groupByDay, withRetry, fetchAll, chunked, dedupe } "
             "from './util.js';", ""]
    for f in funcs:
        lines += ["/**", f" * {f.doc}"]
        lines += [f" * @param {p}" for p in f.param_names]
        lines += [" */", f"export {f.signature()} {{"]
        lines += js_body(rng, f, HELPERS)
        lines += ["}", ""]
    return "\n".join(lines).rstrip() + "\n"


def source_file(rng: random.Random, lang: str, used: dict, num_funcs: int,
                min_params: int = 1) -> tuple[str, str, list[Func]]:
    """(path, text, functions) of one new source file."""
    module = f"{rng.choice(NOUNS)}_{rng.choice(['utils', 'service', 'rules', 'handlers', 'store', 'api'])}"
    funcs = [make_function(rng, lang, used, min_params) for _ in range(num_funcs)]
    if lang == "py":
        pkg = rng.choice(["billing", "orders", "shop", "core", "accounts"])
        return f"src/{pkg}/{module}.py", render_py(rng, module, funcs), funcs
    return f"web/src/{camel(module)}.js", render_js(rng, module, funcs), funcs
