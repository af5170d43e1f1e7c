#!/usr/bin/env python3
"""Report for one evaluation run: report.md, summary.json and plots.

Usage: python3 bench/eval/report.py RESULTS_DIR [--resamples N] [--seed S]

Reads RESULTS_DIR/scored.jsonl (one record per (task, config), written by
eval.py's live run and scored by score.py) and RESULTS_DIR/meta.json, and writes
RESULTS_DIR/report.md, RESULTS_DIR/summary.json and PNG plots beside them.
RESULTS_DIR/capacity_live.json (polykv-bench capacity, run by eval.py with the
strategies in summary.json's capacity.live_inputs) adds the live capacity
table when present.

The statistics are pure stdlib (stats.py) so the tables and answers come out
on any Python 3.11; the plots need matplotlib and are skipped, with a note in
the report, where it is not importable. Every sentence in the report is
generated from the records: a section whose configs are missing (a quick
subset, a custom --configs) is skipped with a note saying what it needed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import live  # noqa: E402  (its PAGE_FORMATS)
import stats  # noqa: E402
from stats import Estimate  # noqa: E402

# The targets of issue 6: the question the suite exists to answer. They are
# goals, not results; every number compared against them comes from data.
TARGET_BYTES_FRACTION = 0.10
TARGET_REL_SUCCESS = 0.97
TARGET_CAPACITY_VS_STATIC = 8.0

REFERENCE_CONFIG = "full@1/f16"
# What a static allocator reserves per session when meta.json does not say:
# the model's maximum context (SmolLM2's is 8192 tokens).
DEFAULT_MAX_CONTEXT_TOKENS = 8192
MIB = 1024.0 * 1024.0
GIB = 1024.0 * MIB

# Display order only; unknown formats sort after these.
FORMAT_ORDER = ["f32", "f16", "K8V4", "K4V8", "K4V4", "K2V2"]

# The live capacity measurement: eval.py runs `polykv-bench capacity` with the
# strategies of summary.json's capacity.live_inputs and saves its JSON here.
LIVE_CAPACITY_FILE = "capacity_live.json"
# polykv-bench rpc --json, run by eval.py: what negotiating with polykvd costs.
NEGOTIATION_FILE = "rpc.json"
# The reference worker's cadence (client/worker): one Commit (+ Sync) every 8
# decode steps and a Reserve every 64 tokens, so at most one reserve+commit
# round trip per 8 generated tokens.
COMMIT_EVERY_STEPS = 8
# Page formats polykv-bench capacity accepts (its --session KFMT:VFMT).
BENCH_FORMATS = live.PAGE_FORMATS
_BITS_FORMAT = {"32": "f32", "16": "f16", "8": "int8", "4": "int4", "2": "int2"}
# Slack a live session reserves beyond the counted tokens (held context,
# question, answer): a reservation short of what the session held would
# flatter the capacity, one slightly over it costs at most a page.
LIVE_TOKEN_SLACK = 2


# --------------------------------------------------------------------------
# Loading


def load_records(path: str) -> list[dict]:
    """Records of a JSONL file; blank lines are skipped, a bad line is an
    error naming its line number (a truncated run should not be averaged
    silently)."""
    out = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise SystemExit(f"report: {path}:{i}: not JSON: {e}")
    return out


def load_meta(path: str) -> dict:
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def load_live(path: str) -> Optional[dict]:
    """The live capacity JSON, None when absent. A file that cannot be read
    becomes an error entry: the report is still written, with a note."""
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            live = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        return {"error": f"{os.path.basename(path)} is not readable JSON ({e})"}
    if not isinstance(live, dict):
        return {"error": f"{os.path.basename(path)} is not a JSON object"}
    return live


def bench_formats(k_format: str, v_format: str, formats: str) -> Optional[tuple[str, str]]:
    """(K, V) page formats as polykv-bench names them. Records of the removed
    in-process harness carry them in k_format/v_format; records without them fall back on the
    config's formats ('f16', 'K8V4')."""
    if k_format in BENCH_FORMATS and v_format in BENCH_FORMATS:
        return k_format, v_format
    if formats in BENCH_FORMATS:
        return formats, formats
    m = re.fullmatch(r"K(\d+)V(\d+)", formats or "")
    if m and m.group(1) in _BITS_FORMAT and m.group(2) in _BITS_FORMAT:
        return _BITS_FORMAT[m.group(1)], _BITS_FORMAT[m.group(2)]
    return None


def live_name(config: str, reference: Optional[str]) -> str:
    """A strategy name for polykv-bench: everything before '=' is the name,
    so '=' must not occur in it."""
    if config == reference:
        return "paged"
    return "polykv:" + config.replace("=", "-")


def parse_config(name: str) -> tuple[str, Optional[float], str]:
    """'h2o@0.25/K8V4' -> ('h2o', 0.25, 'K8V4'); parts missing are None/''."""
    policy, _, rest = name.partition("@")
    budget_s, _, formats = rest.partition("/")
    try:
        budget = float(budget_s) if budget_s else None
    except ValueError:
        budget = None
    return policy, budget, formats


def _num(x) -> Optional[float]:
    """A finite float, or None for absent/null/NaN fields."""
    if x is None:
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _success(x) -> Optional[float]:
    if x is None:
        return None
    if isinstance(x, bool):
        return 1.0 if x else 0.0
    return _num(x)


@dataclass
class Config:
    """All records of one config, keyed by task id."""

    name: str
    policy: str
    budget: float
    formats: str
    k_format: str = ""
    v_format: str = ""
    records: dict = field(default_factory=dict)  # task id -> record

    def column(self, key: str, conv: Callable = _num) -> dict:
        """task id -> converted field value (None where absent)."""
        return {t: conv(r.get(key)) for t, r in self.records.items()}

    def values(self, key: str) -> list[float]:
        """The present values of a numeric field, in task order."""
        col = self.column(key)
        return [col[t] for t in sorted(col) if col[t] is not None]

    def mean(self, key: str) -> Optional[float]:
        return stats.mean(self.values(key))

    def bytes_fraction(self) -> Optional[float]:
        vals = []
        for r in self.records.values():
            bf = _num(r.get("bytes_fraction"))
            if bf is None:
                peak, full = _num(r.get("bytes_peak")), _num(r.get("bytes_full_f16"))
                bf = peak / full if peak is not None and full else None
            if bf is not None:
                vals.append(bf)
        return stats.mean(vals)

    @property
    def is_reference(self) -> bool:
        return (self.policy == "full" and self.formats == "f16"
                and abs(self.budget - 1.0) < 1e-9) or self.name == REFERENCE_CONFIG


def group_configs(records: Iterable[dict]) -> tuple[dict, list[str]]:
    """config name -> Config; the second value lists data problems found."""
    configs: dict[str, Config] = {}
    problems = []
    dup = 0
    for r in records:
        name = r.get("config")
        task = r.get("task")
        if name is None or task is None:
            problems.append("a record without 'config' or 'task' was ignored")
            continue
        c = configs.get(name)
        if c is None:
            p, b, f = parse_config(name)
            policy = r.get("policy") or p
            budget = _num(r.get("budget"))
            budget = budget if budget is not None else (b if b is not None else 1.0)
            formats = r.get("formats") or f
            c = configs[name] = Config(name, policy, budget, formats,
                                       r.get("k_format") or "", r.get("v_format") or "")
        if task in c.records:
            dup += 1
        c.records[task] = r
    if dup:
        problems.append(f"{dup} duplicate (task, config) records: the last one of each was kept")
    return configs, sorted(set(problems))


# --------------------------------------------------------------------------
# Analysis


@dataclass
class Analysis:
    """Everything the renderers need; `to_json` is summary.json."""

    meta: dict
    configs: dict  # name -> Config
    order: list  # config names in display order
    reference: Optional[str]
    families: list
    per_config: dict = field(default_factory=dict)
    winners: list = field(default_factory=list)
    headline: list = field(default_factory=list)
    keys_values: dict = field(default_factory=dict)
    target: dict = field(default_factory=dict)
    capacity: dict = field(default_factory=dict)  # live_inputs and live included
    throughput: list = field(default_factory=list)
    negotiation: dict = field(default_factory=dict)  # from rpc.json, when present
    notes: list = field(default_factory=list)
    summary: str = ""
    resamples: int = stats.DEFAULT_RESAMPLES
    seed: int = stats.DEFAULT_SEED


class Analyzer:
    """Computes the report's statistics over grouped configs.

    Relative success of config c is mean(success_c) / mean(success_ref) over
    the tasks where both are scored, with a paired bootstrap over task ids.
    """

    def __init__(self, records: list[dict], meta: dict,
                 resamples: int = stats.DEFAULT_RESAMPLES,
                 seed: int = stats.DEFAULT_SEED, live: Optional[dict] = None):
        self.kw = {"resamples": resamples, "seed": seed}
        self.live = live
        configs, problems = group_configs(records)
        refs = [n for n, c in configs.items() if c.is_reference]
        ref = REFERENCE_CONFIG if REFERENCE_CONFIG in refs else (refs[0] if refs else None)
        families = sorted({r.get("family") or "?" for r in records})
        self.a = Analysis(meta=meta, configs=configs, order=self._order(configs, meta),
                          reference=ref, families=families, notes=list(problems),
                          resamples=resamples, seed=seed)
        self.task_family = {r.get("task"): r.get("family") or "?" for r in records}

    @staticmethod
    def _order(configs: dict, meta: dict) -> list:
        matrix = meta.get("matrix") or []
        policies = []
        for name in list(matrix) + sorted(configs):
            p = configs[name].policy if name in configs else parse_config(name)[0]
            if p not in policies:
                policies.append(p)
        if "full" in policies:
            policies.remove("full")
            policies.insert(0, "full")

        def key(name):
            c = configs[name]
            fmt = FORMAT_ORDER.index(c.formats) if c.formats in FORMAT_ORDER else len(FORMAT_ORDER)
            return (not c.is_reference, policies.index(c.policy), -c.budget, fmt, c.formats)

        return sorted(configs, key=key)

    # -- primitives --------------------------------------------------------

    def success(self, name: str, family: Optional[str] = None) -> dict:
        col = self.a.configs[name].column("success", _success)
        if family is not None:
            col = {t: v for t, v in col.items() if self.task_family.get(t) == family}
        return {t: v for t, v in col.items() if v is not None}

    def rel_success(self, name: str, family: Optional[str] = None) -> Estimate:
        if self.a.reference is None:
            return stats.EMPTY
        _, c, r = stats.align(self.success(name, family), self.success(self.a.reference, family))
        return stats.ratio_ci(c, r, **self.kw)

    def raw_success(self, name: str, family: Optional[str] = None) -> Estimate:
        col = self.success(name, family)
        return stats.mean_ci([col[t] for t in sorted(col)], **self.kw)

    def agreement(self, name: str) -> Estimate:
        return stats.mean_ci(self.a.configs[name].values("token_agreement"), **self.kw)

    def rel_diff(self, a: str, b: str) -> Estimate:
        """Relative success of a minus that of b, paired over tasks scored in
        a, b and the reference."""
        if self.a.reference is None:
            _, x, y = stats.align(self.success(a), self.success(b))
            return stats.diff_ci(x, y, **self.kw)
        _, x, y, r = stats.align(self.success(a), self.success(b),
                                 self.success(self.a.reference))
        return stats.rel_diff_ci(x, y, r, **self.kw)

    def agreement_diff(self, a: str, b: str) -> Estimate:
        ca = self.a.configs[a].column("token_agreement")
        cb = self.a.configs[b].column("token_agreement")
        _, x, y = stats.align(ca, cb)
        return stats.diff_ci(x, y, **self.kw)

    def score(self, name: str) -> float:
        """The quantity configs are ranked by: relative success, or raw
        success when there is no reference."""
        pc = self.a.per_config[name]
        e = pc["rel_success"] if self.a.reference else pc["success"]
        return e.value if e.value is not None else -math.inf

    def rank_key(self, name: str):
        pc = self.a.per_config[name]
        agr = pc["agreement"].value
        bf = pc["bytes_fraction"]
        return (self.score(name), agr if agr is not None else -math.inf,
                -(bf if bf is not None else math.inf))

    def best(self, names: Iterable[str]) -> Optional[str]:
        names = list(names)
        return max(names, key=self.rank_key) if names else None

    # -- sections ----------------------------------------------------------

    def run(self) -> Analysis:
        a = self.a
        if not a.configs:
            a.notes.append("no records: nothing to report")
            return a
        if a.reference is None:
            a.notes.append(f"the reference config {REFERENCE_CONFIG} is missing: relative "
                           "success is not computed and configs are ranked by raw success")
        for name in a.order:
            self._config_stats(name)
        if a.reference is not None and not self.success(a.reference):
            a.notes.append("the reference has no scored task (every success is null): "
                           "relative success is undefined")
        self._winners()
        self._headline()
        self._keys_values()
        self._target()
        self._capacity()
        self._throughput()
        a.summary = self._summary()
        return a

    def _config_stats(self, name: str) -> None:
        c = self.a.configs[name]
        peak = c.mean("bytes_peak")
        bmean = c.mean("bytes_mean")
        per_family = {}
        for fam in self.a.families:
            n = sum(1 for t in c.records if self.task_family.get(t) == fam)
            if n:
                per_family[fam] = {"n": n, "rel_success": self.rel_success(name, fam),
                                   "success": self.raw_success(name, fam)}
        errors = [r["error"] for r in c.records.values() if r.get("error")]
        if errors:
            self.a.notes.append(f"{name}: {len(errors)} of {len(c.records)} tasks ended in an "
                                f"error (first: {str(errors[0])[:160]}); they count as scored "
                                "however score.py marked them")
        self.a.per_config[name] = {
            "n_tasks": len(c.records),
            "n_errors": len(errors),
            "n_scored": len(self.success(name)),
            "rel_success": self.rel_success(name),
            "success": self.raw_success(name),
            "agreement": self.agreement(name),
            # Teacher-forced on the reference's answer (README: Teacher forcing).
            "kl": stats.mean_ci(c.values("kl_mean"), **self.kw),
            "top1": stats.mean_ci(c.values("top1_agreement"), **self.kw),
            "prefix_agreement": c.mean("prefix_agreement"),
            "bytes_fraction": c.bytes_fraction(),
            "bytes_peak": peak,
            "bytes_peak_mib": peak / MIB if peak is not None else None,
            "bytes_mean_mib": bmean / MIB if bmean is not None else None,
            "kept_slots_mean": c.mean("kept_slots_mean"),
            "decode_tokens_per_s": c.mean("decode_tokens_per_s"),
            "compaction_ms": c.mean("compaction_ms"),
            "prefill_tokens_per_s": c.mean("prefill_tokens_per_s"),
            "per_family": per_family,
        }

    def budgets(self) -> list[float]:
        """Compressed budgets present in the run, largest first."""
        return sorted({round(c.budget, 6) for c in self.a.configs.values() if c.budget < 1.0 - 1e-9},
                      reverse=True)

    def _at(self, budget: float, formats: Optional[str] = None, policy: Optional[str] = None):
        return [n for n in self.a.order
                if abs(self.a.configs[n].budget - budget) < 1e-6
                and (formats is None or self.a.configs[n].formats == formats)
                and (policy is None or self.a.configs[n].policy == policy)]

    def _winners(self) -> None:
        budgets = self.budgets()
        if not budgets:
            self.a.notes.append("no compressed config (budget < 1): the per-budget policy "
                                "ranking and the headline table are skipped")
            return
        for b in budgets:
            names = sorted(self._at(b, "f16"), key=self.rank_key, reverse=True)
            entry = {"budget": b, "ranking": names, "winner": None, "runner_up": None,
                     "difference": None, "agreement_difference": None,
                     "distinguishable": None, "tied_on_success": None}
            if not names:
                entry["sentence"] = (f"At {pct(b)}: no f16 config at this budget "
                                     f"(only {', '.join(self._at(b))}).")
                self.a.winners.append(entry)
                continue
            w = names[0]
            entry["winner"] = w
            pw = self.a.per_config[w]
            measure = "relative success" if self.a.reference else "raw success"
            wv = pw["rel_success"] if self.a.reference else pw["success"]
            if len(names) == 1:
                entry["sentence"] = (f"At {pct(b)} (f16) only {self.a.configs[w].policy} ran: "
                                     f"{measure} {fmt_est(wv)}.")
                self.a.winners.append(entry)
                continue
            r = names[1]
            pr = self.a.per_config[r]
            rv = pr["rel_success"] if self.a.reference else pr["success"]
            d = self.rel_diff(w, r)
            ad = self.agreement_diff(w, r)
            tied = self.score(w) == self.score(r)
            entry.update(runner_up=r, difference=d, agreement_difference=ad,
                         distinguishable=d.excludes(0.0), tied_on_success=tied)
            wp, rp = self.a.configs[w].policy, self.a.configs[r].policy
            s = (f"At {pct(b)} (f16), **{wp}** ranks first of {len(names)} policies with "
                 f"{measure} {fmt_est(wv)}; runner-up {rp} has {fmt_est(rv)}. ")
            agr = (f"token agreement {fmt(pw['agreement'].value)} vs {fmt(pr['agreement'].value)}, "
                   f"difference {fmt_est(ad, signed=True)}, "
                   + ("distinguishable" if ad.excludes(0.0) else "not distinguishable"))
            if tied:
                s += f"They tie on {measure}, so token agreement decides ({agr})."
            else:
                verdict = ("the 95% CI excludes 0, so the win is distinguishable"
                           if d.excludes(0.0) else
                           "the 95% CI includes 0, so the two are not distinguishable")
                s += f"Difference {fmt_est(d, signed=True)} over {d.n} tasks: {verdict} ({agr})."
            entry["sentence"] = s
            self.a.winners.append(entry)

    def _headline(self) -> None:
        by_budget = {w["budget"]: w for w in self.a.winners}
        for b in self.budgets():
            w = by_budget.get(b, {}).get("winner")
            fitting = [n for n in self.a.order
                       if self.a.per_config[n]["bytes_fraction"] is not None
                       and self.a.per_config[n]["bytes_fraction"] <= b + 1e-12]
            self.a.headline.append({"budget": b, "f16_winner": w,
                                    "best_within_bytes": self.best(fitting)})

    def _pairs(self, fmt_a: str, fmt_b: str) -> list[tuple[str, str]]:
        """(a, b) config names with the same policy and budget, formats a and b."""
        out = []
        for n in self.a.order:
            c = self.a.configs[n]
            if c.formats != fmt_a:
                continue
            for m in self._at(c.budget, fmt_b, c.policy):
                out.append((n, m))
        return out

    def _compare(self, a: str, b: str) -> dict:
        ca = self.a.configs[a]
        return {"a": a, "b": b, "policy": ca.policy, "budget": ca.budget,
                "success_difference": self.rel_diff(a, b),
                "agreement_difference": self.agreement_diff(a, b),
                "bytes_fraction_a": self.a.per_config[a]["bytes_fraction"],
                "bytes_fraction_b": self.a.per_config[b]["bytes_fraction"]}

    def _keys_values(self) -> None:
        kv = {"k8v4_vs_k4v8": [], "low_bit": {}, "sentences": []}
        self.a.keys_values = kv
        measure = "relative success" if self.a.reference else "raw success"
        kv["k8v4_vs_k4v8"] = [self._compare(a, b) for a, b in self._pairs("K8V4", "K4V8")]
        cmp = kv["k8v4_vs_k4v8"]
        if not cmp:
            self.a.notes.append("keys or values: no policy and budget has both K8V4 and K4V8, "
                                "so that comparison is skipped")
        else:
            kv["sentences"].append(_keys_values_sentence(cmp, measure))
        for fmt_lo in ("K4V4", "K2V2"):
            pairs = [self._compare(a, b) for a, b in self._pairs(fmt_lo, "f16")]
            kv["low_bit"][fmt_lo] = pairs
            if pairs:
                kv["sentences"].append(_low_bit_sentence(fmt_lo, pairs, measure))
            else:
                self.a.notes.append(f"keys or values: no policy and budget has both {fmt_lo} "
                                    "and f16, so that comparison is skipped")

    def _target(self) -> None:
        t = {"bytes_fraction_max": TARGET_BYTES_FRACTION, "rel_success_min": TARGET_REL_SUCCESS,
             "best": None}
        self.a.target = t
        fitting = [n for n in self.a.order
                   if self.a.per_config[n]["bytes_fraction"] is not None
                   and self.a.per_config[n]["bytes_fraction"] <= TARGET_BYTES_FRACTION]
        if not fitting:
            have = [n for n in self.a.order if self.a.per_config[n]["bytes_fraction"] is not None]
            if have:
                m = min(have, key=lambda n: self.a.per_config[n]["bytes_fraction"])
                t["sentence"] = (f"No config has a mean bytes fraction ≤ {TARGET_BYTES_FRACTION:g}; "
                                 f"the smallest is {m} at {fmt(self.a.per_config[m]['bytes_fraction'])}.")
            else:
                t["sentence"] = "No record reports bytes: the target cannot be checked."
            return
        best = self.best(fitting)
        pc = self.a.per_config[best]
        e = pc["rel_success"]
        t["best"] = best
        t["rel_success"] = e
        t["bytes_fraction"] = pc["bytes_fraction"]
        if e.value is None:
            t["sentence"] = (f"The best config within {TARGET_BYTES_FRACTION:g} of full-f16 bytes "
                             f"is {best} (bytes fraction {fmt(pc['bytes_fraction'])}), but its "
                             "relative success is undefined (no reference or no scored task).")
            return
        gap = e.value - TARGET_REL_SUCCESS
        t["gap"] = gap
        t["met_point"] = e.value >= TARGET_REL_SUCCESS
        t["met_ci_lower"] = e.lo is not None and e.lo >= TARGET_REL_SUCCESS
        verdict = ("meets the target" if t["met_point"] else "misses the target")
        ci = ("and so does its CI lower bound" if t["met_ci_lower"] else
              "but its CI lower bound does not" if t["met_point"] else "")
        t["sentence"] = (
            f"The best config with mean bytes fraction ≤ {TARGET_BYTES_FRACTION:g} is **{best}** "
            f"({fmt(pc['bytes_fraction'])} of full-f16 bytes): relative success {fmt_est(e)} over "
            f"{e.n} tasks, gap {gap:+.4f} to the {TARGET_REL_SUCCESS:g} target — it {verdict}"
            f"{' ' + ci if ci else ''}.")

    def static_session_bytes(self) -> tuple[Optional[float], str]:
        """Bytes a static allocator reserves per session, and where that
        number comes from."""
        meta = self.a.meta
        if _num(meta.get("static_session_bytes")):
            return float(meta["static_session_bytes"]), "meta.json static_session_bytes"
        bpt = _num(meta.get("bytes_per_token_f16"))
        src = "meta.json bytes_per_token_f16"
        if not bpt:
            bpt = next((_num(r.get("bytes_per_token_f16")) for c in self.a.configs.values()
                        for r in c.records.values() if _num(r.get("bytes_per_token_f16"))), None)
            src = "bytes_per_token_f16 in the records"
        max_ctx = _num(meta.get("max_context_tokens")) or DEFAULT_MAX_CONTEXT_TOKENS
        if bpt:
            return max_ctx * bpt, f"{max_ctx:.0f} tokens × {bpt:.0f} B/token ({src})"
        full = [_num(r.get("bytes_full_f16")) for c in self.a.configs.values()
                for r in c.records.values()]
        full = [x for x in full if x]
        if not full:
            return None, "unknown (no bytes_full_f16 and no bytes_per_token_f16)"
        # Estimate bytes per token from the reference's measured peak over the
        # tokens it held; the static allocator reserves max_ctx of them.
        est = []
        if self.a.reference:
            for r in self.a.configs[self.a.reference].records.values():
                toks = ((_num(r.get("context_tokens")) or 0) + (_num(r.get("question_tokens")) or 0)
                        + len(r.get("output_tokens") or []))
                if toks and _num(r.get("bytes_peak")):
                    est.append(float(r["bytes_peak"]) / toks)
        if est:
            return (max(max(full), max_ctx * max(est)),
                    f"estimated: {max_ctx:.0f} tokens × {max(est):.0f} B/token measured on the "
                    "reference (meta.json has no static_session_bytes)")
        return max(full), "max bytes_full_f16 over tasks (a lower bound: no per-token size known)"

    def _capacity(self) -> None:
        self._capacity_computed()
        self.a.capacity["live_inputs"] = self._live_inputs()
        if self.live is not None:
            self._capacity_live(self.live)

    def _capacity_computed(self) -> None:
        cap = {"pool_note": "computed from measured per-session peak bytes "
                            "(sessions = pool bytes / mean bytes_peak), not a live daemon run"}
        self.a.capacity = cap
        static, src = self.static_session_bytes()
        cap["static_session_bytes"] = static
        cap["static_source"] = src
        per_task_full = {}
        for c in self.a.configs.values():
            for t, r in c.records.items():
                v = _num(r.get("bytes_full_f16"))
                if v:
                    per_task_full[t] = v
        paged = stats.mean(list(per_task_full.values()))
        if paged is None and self.a.reference:
            paged = self.a.per_config[self.a.reference]["bytes_peak"]
        cap["paged_session_bytes"] = paged
        with_bytes = [n for n in self.a.order if self.a.per_config[n]["bytes_peak"]]
        if not with_bytes:
            cap["sentence"] = "No record reports bytes_peak: capacity is not computed."
            return

        def entry(n):
            if n is None:
                return None
            peak = self.a.per_config[n]["bytes_peak"]
            return {"config": n, "session_bytes": peak,
                    "rel_success": self.a.per_config[n]["rel_success"],
                    "vs_static": static / peak if static else None,
                    "vs_paged": paged / peak if paged else None,
                    "sessions_per_gib": GIB / peak}

        def cheapest(names):
            return min(names, key=lambda n: self.a.per_config[n]["bytes_peak"]) if names else None

        meeting = [n for n in with_bytes
                   if (self.a.per_config[n]["rel_success"].value or -1) >= TARGET_REL_SUCCESS]
        meeting_lo = [n for n in meeting
                      if (self.a.per_config[n]["rel_success"].lo or -1) >= TARGET_REL_SUCCESS]
        cap["best_meeting"] = entry(cheapest(meeting))
        cap["best_meeting_ci_lower"] = entry(cheapest(meeting_lo))
        cap["cheapest"] = entry(cheapest(with_bytes))
        b = cap["best_meeting"]
        parts = []
        if b is None:
            parts.append(f"No config reaches {TARGET_REL_SUCCESS:g} relative success, so no "
                         "capacity figure meets the quality bar.")
        else:
            e = b["rel_success"]
            lo_ok = e.lo is not None and e.lo >= TARGET_REL_SUCCESS
            parts.append(
                f"The config with the smallest mean per-session peak among those at ≥ "
                f"{TARGET_REL_SUCCESS:g} relative success (point estimate) is **{b['config']}** "
                f"({b['session_bytes'] / MIB:.2f} MiB per session, relative success {fmt_est(e)}; "
                f"its CI lower bound {'meets' if lo_ok else 'does not meet'} {TARGET_REL_SUCCESS:g}).")
            if b["vs_static"] is not None:
                met = b["vs_static"] >= TARGET_CAPACITY_VS_STATIC
                parts.append(
                    f"It fits {b['vs_static']:.1f}× the sessions of a static max-length allocator "
                    f"({static / MIB:.1f} MiB per session: {src}) — the ≥ "
                    f"{TARGET_CAPACITY_VS_STATIC:g}× target is {'met' if met else 'not met'}")
            if b["vs_paged"] is not None:
                parts[-1] += (f"; and {b['vs_paged']:.2f}× the sessions of paged uncompressed "
                              f"f16 ({paged / MIB:.2f} MiB mean per-task peak).")
            else:
                parts[-1] += "."
            bl = cap["best_meeting_ci_lower"]
            if bl and bl["config"] != b["config"]:
                parts.append(f"Counting only configs whose CI lower bound meets "
                             f"{TARGET_REL_SUCCESS:g}, the cheapest is {bl['config']} "
                             f"({fmt_ratio(bl['vs_static'])} vs static).")
            elif not bl:
                parts.append(f"No config's CI lower bound reaches {TARGET_REL_SUCCESS:g}.")
        ch = cap["cheapest"]
        parts.append(f"The cheapest config overall is {ch['config']} "
                     f"({ch['session_bytes'] / MIB:.2f} MiB, {fmt_ratio(ch['vs_static'])} vs "
                     f"static, {fmt_ratio(ch['vs_paged'])} vs paged, relative success "
                     f"{fmt_est(ch['rel_success'])}).")
        parts.append(f"These capacity figures are {cap['pool_note']}.")
        cap["sentence"] = " ".join(parts)

    def session_tokens(self, name: str) -> Optional[float]:
        """Mean over tasks of the tokens one session of config `name` holds at
        its peak: the kept context (the whole context for the reference), the
        question and the answer."""
        vals = []
        for r in self.a.configs[name].records.values():
            if r.get("error"):
                continue
            held = _num(r.get("context_tokens" if name == self.a.reference else "kept_slots_mean"))
            if held is None:
                continue
            vals.append(held + (_num(r.get("question_tokens")) or 0)
                        + len(r.get("output_tokens") or []) + LIVE_TOKEN_SLACK)
        return stats.mean(vals)

    def _live_inputs(self) -> list[dict]:
        """The strategies eval.py measures on a live polykvd: static
        max-length, the reference (paged) and the configs the capacity
        section chose, each as tokens per session in K/V formats."""
        cap = self.a.capacity
        max_ctx = _num(self.a.meta.get("max_context_tokens")) or DEFAULT_MAX_CONTEXT_TOKENS
        out = [{"name": "static", "config": None, "roles": ["static"],
                "tokens": int(math.ceil(max_ctx)), "k_format": "f16", "v_format": "f16"}]
        wanted = [("paged", self.a.reference)] if self.a.reference else []
        wanted += [(role, cap[role]["config"]) for role in ("best_meeting", "cheapest")
                   if cap.get(role)]
        by_config: dict[str, dict] = {}
        for role, config in wanted:
            if config in by_config:
                by_config[config]["roles"].append(role)
                continue
            c = self.a.configs[config]
            tokens = self.session_tokens(config)
            fmts = bench_formats(c.k_format, c.v_format, c.formats)
            if tokens is None or fmts is None:
                self.a.notes.append(
                    f"live capacity: {config} is not measured ("
                    + ("no record has kept_slots_mean/context_tokens" if tokens is None
                       else f"formats {c.k_format or c.formats}/{c.v_format or c.formats} "
                            "are not polykv-bench formats") + ")")
                continue
            e = by_config[config] = {"name": live_name(config, self.a.reference),
                                     "config": config, "roles": [role],
                                     "tokens": int(math.ceil(tokens - 1e-9)),
                                     "k_format": fmts[0], "v_format": fmts[1]}
            out.append(e)
        return out

    def _capacity_live(self, live: dict) -> None:
        """Sessions a live polykvd admitted per strategy (capacity_live.json)
        against static and paged allocation in the same pool."""
        cap = self.a.capacity
        if live.get("error"):
            self.a.notes.append(f"warning: the live capacity measurement failed: {live['error']}; "
                                "only the computed capacity figures are reported")
            cap["live"] = {"error": live["error"]}
            return
        pool = _num(live.get("pool_bytes"))
        strategies = live.get("strategies")
        if not pool or not isinstance(strategies, list) or not strategies:
            self.a.notes.append(f"warning: {LIVE_CAPACITY_FILE} has no pool_bytes or no "
                                "strategies; the live capacity table is skipped")
            return
        inputs = {e["name"]: e for e in cap.get("live_inputs", [])}
        rows = []
        for s in strategies:
            if not isinstance(s, dict) or s.get("name") is None:
                continue
            name = str(s["name"])
            inp = inputs.get(name, {})
            if name == "static":
                config = None
            elif name == "paged":
                config = self.a.reference
            else:
                config = inp.get("config") or (name[len("polykv:"):] if name.startswith("polykv:")
                                               else None)
            roles = ["static"] if name == "static" else (["paged"] if name == "paged" else [])
            roles += [r for r in ("best_meeting", "cheapest")
                      if config and (cap.get(r) or {}).get("config") == config]
            tokens = _num(s.get("tokens"))
            k, v = s.get("k_format") or inp.get("k_format"), s.get("v_format") or inp.get("v_format")
            if (not k or not v) and config in self.a.configs:
                c = self.a.configs[config]
                k, v = bench_formats(c.k_format, c.v_format, c.formats) or (None, None)
            if inp and tokens is not None and int(tokens) != inp["tokens"]:
                self.a.notes.append(
                    f"live capacity: {name} was measured at {int(tokens)} tokens per session but "
                    f"the records now give {inp['tokens']}; re-run the live step "
                    "(eval.py) to refresh capacity_live.json")
            rows.append({"name": name, "config": config, "roles": roles,
                         "tokens": int(tokens) if tokens is not None else None,
                         "k_format": k, "v_format": v,
                         "session_bytes": _num(s.get("session_bytes")),
                         "admitted": int(_num(s.get("admitted")) or 0),
                         "pool_over_session_bytes": _num(s.get("pool_over_session_bytes"))})
        by_role = {}
        for r in rows:
            for role in r["roles"]:
                by_role.setdefault(role, r)
        static_n = by_role.get("static", {}).get("admitted")
        paged_n = by_role["paged"]["admitted"] if "paged" in by_role else None
        for r in rows:
            r["vs_static"] = r["admitted"] / static_n if static_n else None
            r["vs_paged"] = r["admitted"] / paged_n if paged_n else None
        out = {"source": LIVE_CAPACITY_FILE, "pool_bytes": pool, "pool_mib": pool / MIB,
               "note": "measured: sessions a fresh in-process polykvd admitted, each reserving "
                       "its strategy's tokens in its K/V formats, until the daemon refused",
               "strategies": rows, "static_admitted": static_n, "paged_admitted": paged_n,
               "best_meeting": by_role.get("best_meeting"), "target_met": None}
        cap["live"] = out
        pool_s = f"{pool / MIB:g} MiB"
        b, want = out["best_meeting"], cap.get("best_meeting")
        if want is None:
            out["sentence"] = (f"Measured on a live polykvd ({pool_s} pool): no config reaches "
                               f"{TARGET_REL_SUCCESS:g} relative success, so there is no config "
                               f"to check against the {TARGET_CAPACITY_VS_STATIC:g}× target.")
        elif b is None:
            out["sentence"] = (f"{LIVE_CAPACITY_FILE} has no measurement of {want['config']}, the "
                               f"cheapest config at ≥ {TARGET_REL_SUCCESS:g} relative success; "
                               "re-run the live step (eval.py) to measure it.")
        elif not static_n:
            out["sentence"] = (f"Measured on a live polykvd ({pool_s} pool): {b['config']} "
                               f"admitted {b['admitted']} sessions, but static max-length "
                               "allocation admitted none, so the ratio to static is undefined; "
                               "a larger --capacity-pool-mib fixes that.")
        else:
            met = b["vs_static"] >= TARGET_CAPACITY_VS_STATIC
            out["target_met"] = met
            s = (f"Measured on a live polykvd ({pool_s} pool): **{b['config']}**, the cheapest "
                 f"config at ≥ {TARGET_REL_SUCCESS:g} relative success ({b['tokens']} tokens per "
                 f"session in {b['k_format']}/{b['v_format']}), had {b['admitted']} sessions "
                 f"admitted against {static_n} for static max-length allocation: "
                 f"**{fmt_ratio(b['vs_static'])}** static — the ≥ "
                 f"{TARGET_CAPACITY_VS_STATIC:g}× target is {'met' if met else 'not met'}")
            if b["vs_paged"] is not None:
                s += f"; {fmt_ratio(b['vs_paged'])} paged uncompressed f16 ({paged_n} sessions)"
            computed = want.get("vs_static")
            s += (f". The computed figure (pool / mean peak bytes) is {fmt_ratio(computed)}."
                  if computed else ".")
            if static_n < 10:
                s += (f" Static fits only {static_n} sessions in this pool, so the measured "
                      "ratio is coarse; a larger --capacity-pool-mib refines it.")
            out["sentence"] = s

    def _throughput(self) -> None:
        # Policies are compared over their f16 configs so that the formats'
        # kernel costs do not mix into a policy's mean; formats get rows of
        # their own over every policy.
        groups: dict[tuple, list[Config]] = {}
        for n in self.a.order:
            c = self.a.configs[n]
            if c.formats == "f16":
                groups.setdefault(("policy", c.policy), []).append(c)
        for n in self.a.order:
            c = self.a.configs[n]
            groups.setdefault(("formats", c.formats), []).append(c)
        for (kind, label), cs in groups.items():
            recs = [r for c in cs for r in c.records.values()]

            def m(key):
                return stats.mean([v for v in (_num(r.get(key)) for r in recs) if v is not None])

            self.a.throughput.append({
                "by": kind, kind: label, "n_records": len(recs), "n_configs": len(cs),
                "decode_tokens_per_s": m("decode_tokens_per_s"),
                "compaction_ms": m("compaction_ms"),
                "prefill_tokens_per_s": m("prefill_tokens_per_s")})

    def _summary(self) -> str:
        a = self.a
        parts = []
        if a.reference:
            rs = a.per_config[a.reference]["success"]
            parts.append(f"The reference {a.reference} has raw success {fmt_est(rs)} over "
                         f"{rs.n} scored task{'s' if rs.n != 1 else ''}.")
        for w in a.winners[-1:]:
            if w.get("winner"):
                parts.append(f"At the smallest budget ({pct(w['budget'])}) the best f16 policy is "
                             f"{a.configs[w['winner']].policy} "
                             f"({fmt_est(a.per_config[w['winner']]['rel_success'])} relative success"
                             f"{', distinguishable from the runner-up' if w['distinguishable'] else ''}).")
        if a.target.get("sentence"):
            parts.append(strip_md(a.target["sentence"]))
        b = a.capacity.get("best_meeting")
        if b and b.get("vs_static"):
            parts.append(f"Capacity at ≥ {TARGET_REL_SUCCESS:g} relative success: "
                         f"{b['vs_static']:.1f}× static, {fmt_ratio(b['vs_paged'])} paged "
                         f"({b['config']}; from measured per-session peaks).")
        lb = (a.capacity.get("live") or {}).get("best_meeting")
        if lb and lb.get("vs_static") is not None:
            parts.append(f"On a live polykvd ({a.capacity['live']['pool_mib']:g} MiB pool) it was "
                         f"admitted {fmt_ratio(lb['vs_static'])} as often as static allocation.")
        return " ".join(parts)


def _keys_values_sentence(cmp: list[dict], measure: str) -> str:
    m = len(cmp)
    s_ahead = sum(1 for c in cmp if (c["success_difference"].value or 0) > 0)
    s_behind = sum(1 for c in cmp if (c["success_difference"].value or 0) < 0)
    s_k = sum(1 for c in cmp if c["success_difference"].excludes(0) and c["success_difference"].value > 0)
    s_v = sum(1 for c in cmp if c["success_difference"].excludes(0) and c["success_difference"].value < 0)
    a_k = sum(1 for c in cmp if c["agreement_difference"].excludes(0) and c["agreement_difference"].value > 0)
    a_v = sum(1 for c in cmp if c["agreement_difference"].excludes(0) and c["agreement_difference"].value < 0)
    sd = stats.mean([c["success_difference"].value for c in cmp if c["success_difference"].value is not None])
    ad = stats.mean([c["agreement_difference"].value for c in cmp if c["agreement_difference"].value is not None])
    where = ", ".join(f"{c['policy']}@{pct(c['budget'])}" for c in cmp)
    detail = (f"Over {m} matched pair{'s' if m != 1 else ''} ({where}), K8V4 minus K4V8 averages "
              f"{fmt(sd, signed=True)} {measure} and {fmt(ad, signed=True)} token agreement; "
              f"K8V4 is ahead on {measure} in {s_ahead} and behind in {s_behind}; the difference's "
              f"95% CI excludes 0 for {measure} in {s_k + s_v} (K8V4 better in {s_k}) and for "
              f"token agreement in {a_k + a_v} (K8V4 better in {a_k}).")
    k_side, v_side = s_k + a_k, s_v + a_v
    if k_side and not v_side:
        head = "**Keys need the bits more than values**: at the same bytes, 8-bit keys with 4-bit values beat the reverse."
    elif v_side and not k_side:
        head = "**Values need the bits more than keys**: at the same bytes, 8-bit values with 4-bit keys beat the reverse."
    elif k_side and v_side:
        head = "**Mixed**: K8V4 and K4V8 each win distinguishably somewhere, so neither keys nor values dominate."
    else:
        lean = ("K8V4 is ahead more often" if s_ahead > s_behind else
                "K4V8 is ahead more often" if s_behind > s_ahead else "neither is ahead more often")
        head = (f"**Not distinguishable on these tasks**: {lean}, but no K8V4−K4V8 difference "
                "excludes 0.")
    return f"{head} {detail}"


def _low_bit_sentence(fmt_lo: str, pairs: list[dict], measure: str) -> str:
    sd = [p["success_difference"].value for p in pairs if p["success_difference"].value is not None]
    ad = [p["agreement_difference"].value for p in pairs if p["agreement_difference"].value is not None]
    dist = sum(1 for p in pairs if p["success_difference"].excludes(0))
    dist_a = sum(1 for p in pairs if p["agreement_difference"].excludes(0))
    ratio = [p["bytes_fraction_a"] / p["bytes_fraction_b"] for p in pairs
             if p["bytes_fraction_a"] and p["bytes_fraction_b"]]
    m = len(pairs)
    change = f"changes {measure} by {fmt(stats.mean(sd), signed=True)} on average"
    if len(sd) > 1:
        change += f" (range {min(sd):+.3f} to {max(sd):+.3f})"
    return (f"**{fmt_lo} vs f16** at the same policy and budget ({m} pair{'s' if m != 1 else ''}): "
            f"{fmt_lo} {change} "
            f"and token agreement by {fmt(stats.mean(ad), signed=True)}, using "
            f"{fmt(stats.mean(ratio))}× the bytes; the {measure} difference is distinguishable "
            f"from 0 in {dist} of {m} and the agreement difference in {dist_a} of {m}.")


def analyze(records: list[dict], meta: dict, resamples: int = stats.DEFAULT_RESAMPLES,
            seed: int = stats.DEFAULT_SEED, live: Optional[dict] = None) -> Analysis:
    return Analyzer(records, meta, resamples, seed, live).run()


# --------------------------------------------------------------------------
# Formatting


def fmt(x: Optional[float], d: int = 3, signed: bool = False) -> str:
    if x is None:
        return "n/a"
    return f"{x:+.{d}f}" if signed else f"{x:.{d}f}"


def fmt_est(e: Optional[Estimate], d: int = 3, signed: bool = False) -> str:
    if e is None or e.value is None:
        return "n/a"
    if e.lo is None or e.hi is None:
        return f"{fmt(e.value, d, signed)} [CI n/a]"
    return f"{fmt(e.value, d, signed)} [{fmt(e.lo, d, signed)}, {fmt(e.hi, d, signed)}]"


def fmt_ratio(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{x:.1f}×" if x >= 10 else f"{x:.2f}×"


def pct(b: float) -> str:
    return f"{b * 100:g}%"


def strip_md(s: str) -> str:
    return s.replace("**", "")


def fmt_duration(s) -> str:
    s = _num(s)
    if s is None:
        return "n/a"
    s = int(round(s))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return out


# --------------------------------------------------------------------------
# Plots


POLICY_COLORS = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple",
                 "tab:brown", "tab:pink", "tab:gray", "tab:olive", "tab:cyan",
                 "navy", "darkgoldenrod"]
FORMAT_MARKERS = {"f32": "D", "f16": "o", "K8V4": "s", "K4V8": "^", "K4V4": "v", "K2V2": "X"}
EXTRA_MARKERS = ["P", "*", "h", "<", ">", "d"]


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Points not dominated by one with fewer-or-equal bytes and a higher
    score, ascending in bytes (a step line through them is the front)."""
    front, best = [], -math.inf
    for x, y in sorted(points, key=lambda p: (p[0], -p[1])):
        if y > best:
            front.append((x, y))
            best = y
    return front


def make_plots(a: Analysis, out_dir: str) -> tuple[dict, list[str]]:
    """Writes the PNGs; returns ({name: filename}, notes)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
        from matplotlib.lines import Line2D
    except ImportError:
        return {}, ["plots skipped: matplotlib is not importable (run through eval.py, or "
                    "pip install -r bench/eval/requirements.txt)"]
    files, notes = {}, []
    policies = []
    for n in a.order:
        if a.configs[n].policy not in policies:
            policies.append(a.configs[n].policy)
    color = {p: POLICY_COLORS[i % len(POLICY_COLORS)] for i, p in enumerate(policies)}
    formats = []
    for n in a.order:
        if a.configs[n].formats not in formats:
            formats.append(a.configs[n].formats)
    extra = iter(EXTRA_MARKERS * 4)
    marker = {f: FORMAT_MARKERS.get(f) or next(extra) for f in formats}

    def legend(ax):
        ph = [Line2D([], [], color=color[p], marker="o", ls="", label=p) for p in policies]
        fh = [Line2D([], [], color="black", marker=marker[f], ls="", label=f) for f in formats]
        l1 = ax.legend(handles=ph, title="policy", loc="upper left", bbox_to_anchor=(1.01, 1.0),
                       fontsize=8, title_fontsize=8)
        ax.add_artist(l1)
        ax.legend(handles=fh, title="formats", loc="lower left", bbox_to_anchor=(1.01, 0.0),
                  fontsize=8, title_fontsize=8)

    # Many configs share a bytes fraction (same budget and formats); a small
    # per-policy horizontal nudge keeps their markers and error bars apart.
    # The Pareto front is drawn at the true x.
    nudge = {p: 1.0 + 0.06 * (i / max(len(policies) - 1, 1) - 0.5) for i, p in enumerate(policies)}

    def scatter(key: str, ylabel: str, fname: str, target_y: Optional[float]):
        pts = []
        fig, ax = plt.subplots(figsize=(11, 6))
        for n in a.order:
            pc = a.per_config[n]
            e, x = pc[key], pc["bytes_fraction"]
            if e.value is None or not x:
                continue
            c = a.configs[n]
            yerr = None
            if e.lo is not None:
                yerr = [[max(e.value - e.lo, 0)], [max(e.hi - e.value, 0)]]
            ax.errorbar([x * nudge[c.policy]], [e.value], yerr=yerr, fmt=marker[c.formats], color=color[c.policy],
                        ecolor=color[c.policy], elinewidth=0.8, capsize=2, alpha=0.85, ms=6)
            pts.append((x, e.value))
        if not pts:
            plt.close(fig)
            notes.append(f"{fname} skipped: no config has both {key} and bytes_fraction")
            return
        front = pareto_front(pts)
        ax.step([p[0] for p in front], [p[1] for p in front], where="post", color="black",
                lw=1, ls="--", label="Pareto front")
        ax.set_xscale("log")
        if target_y is not None:
            ax.axvline(TARGET_BYTES_FRACTION, color="green", lw=0.8, ls=":")
            ax.axhline(target_y, color="green", lw=0.8, ls=":")
            ax.fill_between([min(p[0] for p in pts) * 0.8, TARGET_BYTES_FRACTION], target_y,
                            max(1.05, max(p[1] for p in pts) + 0.05), color="green", alpha=0.06)
        ax.set_xlabel("bytes: fraction of the full-f16 peak (log scale; markers nudged ±3% "
                      "by policy)")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{a.meta.get('name', '')}: {ylabel} vs memory (95% bootstrap CI)")
        ax.grid(True, which="both", alpha=0.3)
        legend(ax)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, fname), dpi=120, bbox_inches="tight")
        plt.close(fig)
        files[fname] = fname

    if a.reference:
        scatter("rel_success", "relative task success", "pareto.png", TARGET_REL_SUCCESS)
    else:
        scatter("success", "raw task success", "pareto.png", None)
    scatter("agreement", "token agreement with full f16", "agreement.png", None)

    cap = a.capacity
    if cap.get("cheapest"):
        fig, ax = plt.subplots(figsize=(8, 5.5))
        pools = [2 ** (i / 4) for i in range(-4, 29)]  # 0.5 .. 128 GiB
        lines = []
        if cap.get("static_session_bytes"):
            lines.append(("static max-length allocation", cap["static_session_bytes"], "gray", "-"))
        if cap.get("paged_session_bytes"):
            lines.append(("paged, uncompressed f16", cap["paged_session_bytes"], "tab:blue", "-"))
        if cap.get("best_meeting"):
            b = cap["best_meeting"]
            lines.append((f"best ≥{TARGET_REL_SUCCESS:g} rel. success: {b['config']}",
                          b["session_bytes"], "tab:green", "-"))
        ch = cap["cheapest"]
        lines.append((f"cheapest: {ch['config']}", ch["session_bytes"], "tab:red", "--"))
        for label, per, col, ls in lines:
            ax.plot(pools, [math.floor(p * GIB / per) for p in pools], label=label, color=col, ls=ls)
        live = cap.get("live") or {}
        role_color = {"static": "gray", "paged": "tab:blue", "best_meeting": "tab:green",
                      "cheapest": "tab:red"}
        for r in live.get("strategies") or []:
            if r["admitted"] <= 0:
                continue  # no place on a log axis
            col = next((role_color[x] for x in r["roles"] if x in role_color), "black")
            ax.plot([live["pool_bytes"] / GIB], [r["admitted"]], marker="*", ms=13, ls="",
                    color=col, mec="black", mew=0.6,
                    label=f"live polykvd: {r['name']} ({r['admitted']})")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_xlabel("pool size (GiB)")
        ax.set_ylabel("concurrent sessions")
        ax.set_title("Sessions per pool: lines from measured per-session peak bytes"
                     + ("; stars measured on a live polykvd" if live.get("strategies")
                        else " (not a live run)"), fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "capacity.png"), dpi=120, bbox_inches="tight")
        plt.close(fig)
        files["capacity.png"] = "capacity.png"
    else:
        notes.append("capacity.png skipped: no bytes_peak in the records")

    ranked = [w for w in a.winners if w.get("ranking")]
    if ranked:
        key = "rel_success" if a.reference else "success"
        fig, axes = plt.subplots(1, len(ranked), figsize=(3.2 * len(ranked) + 1, 4.5),
                                 sharey=True, squeeze=False)
        for ax, w in zip(axes[0], ranked):
            names = [n for n in w["ranking"] if a.per_config[n][key].value is not None]
            vals = [a.per_config[n][key].value for n in names]
            errs = [[max(v - (a.per_config[n][key].lo if a.per_config[n][key].lo is not None else v), 0)
                     for n, v in zip(names, vals)],
                    [max((a.per_config[n][key].hi if a.per_config[n][key].hi is not None else v) - v, 0)
                     for n, v in zip(names, vals)]]
            ax.bar(range(len(names)), vals, yerr=errs, capsize=2,
                   color=[color[a.configs[n].policy] for n in names])
            ax.set_xticks(range(len(names)))
            ax.set_xticklabels([a.configs[n].policy for n in names], rotation=60, ha="right",
                               fontsize=7)
            ax.set_title(f"budget {pct(w['budget'])} (f16)", fontsize=9)
            if a.reference:
                ax.axhline(TARGET_REL_SUCCESS, color="green", lw=0.8, ls=":")
            ax.grid(True, axis="y", alpha=0.3)
        axes[0][0].set_ylabel("relative task success" if a.reference else "raw task success")
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "budgets.png"), dpi=120, bbox_inches="tight")
        plt.close(fig)
        files["budgets.png"] = "budgets.png"
    return files, notes


# --------------------------------------------------------------------------
# Markdown


ROLE_LABELS = {"static": "static max-length", "paged": "paged f16 (uncompressed)",
               "best_meeting": f"cheapest at ≥ {TARGET_REL_SUCCESS:g} rel. success",
               "cheapest": "cheapest overall"}


def render_live_capacity(live: dict) -> list[str]:
    """The capacity section's live table; nothing when no measurement."""
    if not live.get("strategies"):
        return []
    L = ["", f"#### Measured on a live polykvd (pool {live['pool_mib']:g} MiB)", "",
         "Each strategy ran on a fresh in-process polykvd with this pool: sessions (one agent "
         "each) opened and reserved the strategy's tokens in its K/V formats until the daemon "
         "refused. Session bytes are the pages one session holds, so page rounding is included; "
         "ratios divide sessions admitted.", ""]
    rows = []
    for r in live["strategies"]:
        role = "; ".join(ROLE_LABELS.get(x, x) for x in r["roles"]) or "—"
        fmts = f"{r['k_format']}/{r['v_format']}" if r["k_format"] and r["v_format"] else "n/a"
        sb = r["session_bytes"]
        rows.append([f"{r['name']}", role,
                     r["tokens"] if r["tokens"] is not None else "n/a", fmts,
                     f"{sb / MIB:.2f}" if sb else "n/a", r["admitted"],
                     fmt(r["pool_over_session_bytes"], 1),
                     fmt_ratio(r["vs_static"]), fmt_ratio(r["vs_paged"])])
    L += md_table(["strategy", "role", "tokens / session", "K/V formats", "session MiB",
                   "sessions admitted", "pool / session bytes", "vs static", "vs paged"], rows)
    if live.get("sentence"):
        L += ["", f"- {live['sentence']}"]
    return L


def render_markdown(a: Analysis, plots: dict) -> str:
    m = a.meta
    L = [f"# polykv agentic evaluation: {m.get('name', 'unnamed run')}", ""]
    machine = m.get("machine") or {}
    counts = m.get("task_counts") or {}
    if not counts:
        for c in a.configs.values():
            for t, r in c.records.items():
                counts.setdefault(r.get("family") or "?", set()).add(t)
        counts = {k: len(v) for k, v in counts.items()}
    sha = m.get("model_sha256") or ""
    L += [
        f"- **date:** {m.get('date', 'n/a')}",
        f"- **command:** `{m.get('command', 'n/a')}`",
        f"- **model:** {m.get('model', 'n/a')}" + (f" (sha256 {sha[:16]}…)" if sha else ""),
        f"- **git commit:** {m.get('git_commit', 'n/a')}",
        f"- **machine:** {machine.get('cpus', '?')} CPUs, {machine.get('cpu_model', 'unknown CPU')}",
        f"- **tasks:** {sum(counts.values())} ("
        + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) + ")",
        f"- **configs:** {len(a.configs)}; **split:** {m.get('split') or 'n/a'}; "
        f"**seed:** {m.get('seed', 'n/a')}; "
        f"**wall time:** {fmt_duration(m.get('wall_seconds'))}",
        f"- **reference:** {a.reference or 'missing'}; intervals are 95% paired bootstrap "
        f"percentile CIs over tasks ({a.resamples} resamples, seed {a.seed})",
        "",
    ]

    measure = "rel. success" if a.reference else "raw success"
    key = "rel_success" if a.reference else "success"
    L += ["## Headline", ""]
    if a.headline:
        rows = []
        for h in a.headline:
            w, b = h["f16_winner"], h["best_within_bytes"]
            rows.append([
                pct(h["budget"]),
                a.configs[w].policy if w else "n/a",
                fmt_est(a.per_config[w][key]) if w else "n/a",
                fmt(a.per_config[w]["bytes_fraction"]) if w else "n/a",
                b or "none fits",
                fmt_est(a.per_config[b][key]) if b else "n/a",
                fmt(a.per_config[b]["bytes_fraction"]) if b else "n/a",
            ])
        L += md_table(["budget", "best policy @f16", f"{measure} [95% CI]", "bytes fraction",
                       "best config with bytes ≤ budget", f"{measure} [95% CI]",
                       "bytes fraction"], rows)
        L += ["", f"Bytes fraction = mean per-task peak KV bytes / the same task's peak under "
                  f"{REFERENCE_CONFIG}. {len(a.families)} families, {sum(counts.values())} tasks, model {os.path.basename(str(m.get('model', '?')))}.", ""]
    else:
        L += ["_Skipped: no compressed config (budget < 1) in this run._", ""]

    L += ["## Answers", "", "### Which policy wins at each budget?", ""]
    if a.winners:
        L += [f"- {w['sentence']}" for w in a.winners]
    else:
        L += ["_Skipped: no compressed f16 configs._"]
    L += ["", "### Keys or values?", ""]
    if a.keys_values.get("sentences"):
        L += [f"- {s}" for s in a.keys_values["sentences"]]
        rows = []
        for label, pairs in ([("K8V4 − K4V8", a.keys_values["k8v4_vs_k4v8"])]
                             + [(f"{k} − f16", v) for k, v in a.keys_values["low_bit"].items()]):
            for p in pairs:
                # The configs' formats with their /T<n> and /R<n>, if any.
                if "/" in p["a"] and "/" in p["b"]:
                    label = f"{p['a'].split('/', 1)[1]} − {p['b'].split('/', 1)[1]}"
                rows.append([label, p["policy"], pct(p["budget"]),
                             fmt_est(p["success_difference"], signed=True),
                             fmt_est(p["agreement_difference"], signed=True),
                             f"{fmt(p['bytes_fraction_a'])} / {fmt(p['bytes_fraction_b'])}"])
        L += [""] + md_table(["comparison", "policy", "budget", f"Δ {measure} [95% CI]",
                              "Δ token agreement [95% CI]", "bytes fraction (a / b)"], rows)
    else:
        L += ["_Skipped: the run has no K8V4/K4V8 pair and no K4V4 or K2V2 config beside an f16 "
              "one at the same policy and budget._"]
    L += ["", f"### Target: ≤ {TARGET_BYTES_FRACTION:g} bytes fraction at ≥ {TARGET_REL_SUCCESS:g} "
              f"relative success, ≥ {TARGET_CAPACITY_VS_STATIC:g}× sessions vs static", ""]
    if a.target.get("sentence"):
        L += [f"- {a.target['sentence']}"]
    if a.capacity.get("sentence"):
        L += [f"- {a.capacity['sentence']}"]
    cap = a.capacity
    if cap.get("cheapest"):
        rows = []
        ents = [("static max-length", cap.get("static_session_bytes"), None),
                ("paged f16 (uncompressed)", cap.get("paged_session_bytes"), None)]
        for label, k in (("best ≥ target (point)", "best_meeting"),
                         ("best ≥ target (CI lower bound)", "best_meeting_ci_lower"),
                         ("cheapest overall", "cheapest")):
            if cap.get(k):
                ents.append((f"{label}: {cap[k]['config']}", cap[k]["session_bytes"],
                             cap[k]["rel_success"]))
        for label, per, e in ents:
            if not per:
                continue
            rows.append([label, f"{per / MIB:.2f}",
                         f"{GIB / per:.1f}", f"{64 * GIB / per:.0f}",
                         fmt_ratio(cap["static_session_bytes"] / per) if cap.get("static_session_bytes") else "n/a",
                         fmt_est(e) if e else "—"])
        L += ["", "#### Computed from per-session peak bytes (pool / bytes, not a live run)",
              ""] + md_table(["allocation", "MiB / session", "sessions / GiB",
                              "sessions / 64 GiB", "vs static", "rel. success"], rows)
    L += render_live_capacity(cap.get("live") or {})
    L += [""]

    L += ["## All configs", ""]
    rows = []
    for n in a.order:
        pc = a.per_config[n]
        rows.append([n, fmt_est(pc["rel_success"]), fmt_est(pc["success"], 2),
                     fmt_est(pc["agreement"]), fmt_est(pc["kl"], 4), fmt_est(pc["top1"]),
                     fmt(pc["bytes_fraction"]),
                     fmt(pc["bytes_peak_mib"], 2), fmt(pc["decode_tokens_per_s"], 1),
                     f"{pc['n_scored']}/{pc['n_tasks']}"
                     + (f", {pc['n_errors']} errors" if pc["n_errors"] else "")])
    L += md_table(["config", "rel. success [95% CI]", "raw success [95% CI]",
                   "token agreement [95% CI]", "KL nats/token [95% CI]",
                   "top-1 agreement [95% CI]", "bytes fraction", "peak MiB", "decode tok/s",
                   "scored/tasks"], rows)
    L += ["", "## Per family", "",
          f"Cells: {'relative success (raw success)' if a.reference else 'raw success'}; "
          "n/a where the reference solves no task of the family.", ""]
    rows = []
    for n in a.order:
        pf = a.per_config[n]["per_family"]
        row = [n]
        for fam in a.families:
            if fam not in pf:
                row.append("—")
            elif a.reference:
                row.append(f"{fmt(pf[fam]['rel_success'].value, 2)} ({fmt(pf[fam]['success'].value, 2)})")
            else:
                row.append(fmt(pf[fam]["success"].value, 2))
        rows.append(row)
    fam_n = {}
    for c in a.configs.values():
        for t, r in c.records.items():
            fam_n.setdefault(r.get("family") or "?", set()).add(t)
    L += md_table(["config"] + [f"{f} (n={len(fam_n.get(f, ()))})" for f in a.families], rows)
    if a.reference and a.reference in a.per_config:
        pf = a.per_config[a.reference]["per_family"]
        L += ["", "Reference raw success per family with 95% CI: "
              + "; ".join(f"{f} {fmt_est(pf[f]['success'], 2)} (n={pf[f]['success'].n})"
                          for f in a.families if f in pf) + "."]

    L += ["", "## Throughput and overhead", "",
          "Means over records: per policy over its f16 configs (all budgets), per formats "
          "over every policy and budget. Prefill is of the shared context.", ""]
    for kind, head in (("policy", "policy (f16)"), ("formats", "formats")):
        rows = [[t[kind], t["n_records"], fmt(t["decode_tokens_per_s"], 1),
                 fmt(t["compaction_ms"], 1), fmt(t["prefill_tokens_per_s"], 1)]
                for t in a.throughput if t["by"] == kind]
        if rows:
            L += md_table([head, "records", "decode tok/s", "compaction ms", "prefill tok/s"],
                          rows) + [""]

    ng = a.negotiation
    if ng:
        line = (f"Negotiation (`polykv-bench rpc`, {NEGOTIATION_FILE}): a reserve+commit round trip "
                f"to polykvd takes p50 {ng['reserve_commit_p50_us']:.0f} µs / p99 "
                f"{ng['reserve_commit_p99_us']:.0f} µs with one client (gRPC echo floor "
                f"{ng['echo_p50_us']:.0f} µs)")
        if "reserve_commit_p50_us_8_clients" in ng:
            line += f", p50 {ng['reserve_commit_p50_us_8_clients']:.0f} µs with 8 clients"
        line += (f". The worker makes at most one per {COMMIT_EVERY_STEPS} decode steps: "
                 f"{ng['per_token_us']:.0f} µs per generated token")
        if "share_of_decode_step" in ng:
            line += (f", {100 * ng['share_of_decode_step']:.2f}% of the reference's decode step "
                     f"({ng['decode_step_us'] / 1e3:.1f} ms here)")
        L += [line + ". Compaction ms above (runs of the removed in-process harness only) "
              "is the plan + gather + re-encode of one compaction, paid once per compaction, "
              "not per token.", ""]

    L += ["## Plots", ""]
    captions = {
        "pareto.png": "Task success vs memory; dashed: Pareto front; dotted: target.",
        "agreement.png": "Token agreement with the full-f16 output vs memory.",
        "capacity.png": "Concurrent sessions per pool size (from measured per-session peaks).",
        "budgets.png": "Policies at each budget (f16).",
    }
    if (a.capacity.get("live") or {}).get("strategies"):
        captions["capacity.png"] = ("Concurrent sessions per pool size: lines computed from "
                                    "measured per-session peaks, stars measured on a live polykvd.")
    if plots:
        for f, cap_text in captions.items():
            if f in plots:
                L += [f"![{f}]({plots[f]})", "", f"_{cap_text}_", ""]
    else:
        L += ["_No plots._", ""]

    L += ["## Notes", ""]
    L += [f"- {n}" for n in a.notes]
    L += ["- Relative success = mean(success of config) / mean(success of the reference) over "
          "the tasks where both are scored (success not null); CIs resample task ids with "
          "replacement and recompute both means (paired).",
          "- A difference is called distinguishable when its 95% CI excludes 0."]
    return "\n".join(L) + "\n"


# --------------------------------------------------------------------------
# summary.json


def to_jsonable(x):
    if isinstance(x, Estimate):
        return x.to_dict()
    if isinstance(x, dict):
        return {k: to_jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [to_jsonable(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def summary_json(a: Analysis, plots: dict) -> dict:
    configs = []
    for n in a.order:
        c = a.configs[n]
        configs.append({"config": n, "policy": c.policy, "budget": c.budget,
                        "formats": c.formats, "k_format": c.k_format, "v_format": c.v_format,
                        "reference": n == a.reference, **a.per_config.get(n, {})})
    return to_jsonable({
        "meta": a.meta, "reference": a.reference, "families": a.families,
        "method": {"resamples": a.resamples, "seed": a.seed, "confidence": stats.DEFAULT_CONFIDENCE,
                   "ci": "paired percentile bootstrap over task ids"},
        "targets": {"bytes_fraction_max": TARGET_BYTES_FRACTION,
                    "rel_success_min": TARGET_REL_SUCCESS,
                    "capacity_vs_static_min": TARGET_CAPACITY_VS_STATIC},
        "configs": configs, "headline": a.headline, "winners": a.winners,
        "keys_values": a.keys_values, "target": a.target, "capacity": a.capacity,
        "throughput": a.throughput, "negotiation": a.negotiation, "plots": plots, "notes": a.notes, "summary": a.summary,
    })


def negotiation(path: str, a: Analysis) -> dict:
    """Reserve+commit round trips from polykv-bench rpc, set against the
    reference's measured decode step: the negotiation cost per token."""
    if not os.path.exists(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            rpc = json.load(f)
        one = rpc["clients_1"]
        out = {"reserve_commit_p50_us": one["reserve_commit"]["p50_us"],
               "reserve_commit_p99_us": one["reserve_commit"]["p99_us"],
               "echo_p50_us": one["echo"]["p50_us"]}
        eight = rpc.get("clients_8") or {}
        if eight:
            out["reserve_commit_p50_us_8_clients"] = eight["reserve_commit"]["p50_us"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        a.notes.append(f"{NEGOTIATION_FILE} is not usable ({e}); negotiation cost not reported")
        return {}
    ref = next((t for t in a.throughput if t["by"] == "policy" and t["policy"] == "full"), None)
    tps = ref and ref.get("decode_tokens_per_s")
    out["per_token_us"] = out["reserve_commit_p50_us"] / COMMIT_EVERY_STEPS
    if tps:
        out["decode_step_us"] = 1e6 / tps
        out["share_of_decode_step"] = out["per_token_us"] / out["decode_step_us"]
    return out


def write_report(results_dir: str, resamples: int = stats.DEFAULT_RESAMPLES,
                 seed: int = stats.DEFAULT_SEED, plots: bool = True) -> Analysis:
    scored = os.path.join(results_dir, "scored.jsonl")
    if not os.path.exists(scored):
        raise SystemExit(f"report: {scored} not found (run score.py first, or eval.py)")
    a = analyze(load_records(scored), load_meta(os.path.join(results_dir, "meta.json")),
                resamples, seed, load_live(os.path.join(results_dir, LIVE_CAPACITY_FILE)))
    a.negotiation = negotiation(os.path.join(results_dir, NEGOTIATION_FILE), a)
    files, notes = make_plots(a, results_dir) if plots and a.configs else ({}, [])
    a.notes.extend(notes)
    with open(os.path.join(results_dir, "report.md"), "w", encoding="utf-8") as f:
        f.write(render_markdown(a, files))
    with open(os.path.join(results_dir, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary_json(a, files), f, indent=1, ensure_ascii=False)
        f.write("\n")
    return a


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results_dir", help="folder with scored.jsonl and meta.json")
    ap.add_argument("--resamples", type=int, default=stats.DEFAULT_RESAMPLES)
    ap.add_argument("--seed", type=int, default=stats.DEFAULT_SEED)
    ap.add_argument("--no-plots", action="store_true", help="tables and answers only")
    ap.add_argument("--quiet", action="store_true", help="no summary paragraph on stderr")
    args = ap.parse_args(argv)
    a = write_report(args.results_dir, args.resamples, args.seed, not args.no_plots)
    print(os.path.join(args.results_dir, "report.md"))
    if a.summary and not args.quiet:
        print(a.summary, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
