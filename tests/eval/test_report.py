"""Tests for bench/eval/stats.py, report.py and eval.py's pure parts.

Offline and seeded. The statistics are pure stdlib; the plot tests skip where
matplotlib is not importable (run them with the eval venv's python:
~/.cache/polykv/eval-venv/bin/python -m unittest tests/eval/test_report.py).

Run from the repository root: python3 -m unittest tests/eval/test_report.py -v
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench", "eval"))

import eval as driver  # noqa: E402  (bench/eval/eval.py)
import report  # noqa: E402
import stats  # noqa: E402

HAVE_MPL = importlib.util.find_spec("matplotlib") is not None
SEED = 20240611
# Fewer resamples keep the suite fast; the CI logic is the same at 2000.
FAST = 400

BYTES_PER_TOKEN = 23040
FORMAT_BYTES = {"f32": 2.0, "f16": 1.0, "K8V4": 0.375, "K4V8": 0.375, "K4V4": 0.25, "K2V2": 0.125}
FAMILIES = ["recall", "coding", "tools", "multiagent"]


def make_records(configs: dict, num_tasks: int = 20, seed: int = SEED,
                 ref_rate: float = 0.7) -> list[dict]:
    """Seeded synthetic scored records.

    configs: config name -> quality q in [0, 1]: the chance that the config
    keeps a task the reference solves (q=None: copy the reference exactly).
    Bytes scale with budget × the formats' bytes per element, so bytes
    fractions are known in closed form.
    """
    print(f"synthetic records seed={seed} tasks={num_tasks}", file=sys.stderr)
    rng = random.Random(seed)
    tasks = []
    for i in range(num_tasks):
        ctx = rng.randint(1500, 2500)
        tasks.append({"task": f"t{i:03d}", "family": FAMILIES[i % len(FAMILIES)],
                      "ctx": ctx, "ref": rng.random() < ref_rate})
    out = []
    for name, q in configs.items():
        policy, budget, formats = report.parse_config(name)
        for t in tasks:
            full = t["ctx"] * BYTES_PER_TOKEN
            frac = budget * FORMAT_BYTES[formats]
            if q is None:
                success, agree = t["ref"], 1.0
            else:
                success = (rng.random() < q) if t["ref"] else (rng.random() < 0.05)
                agree = max(0.0, min(1.0, q + rng.gauss(0, 0.05)))
            out.append({
                "task": t["task"], "family": t["family"], "config": name, "policy": policy,
                "budget": budget, "formats": formats, "k_format": formats, "v_format": formats,
                "context_tokens": t["ctx"], "question_tokens": 40,
                "kept_slots_mean": t["ctx"] * budget, "bytes_peak": int(full * frac),
                "bytes_mean": int(full * frac * 0.8), "bytes_full_f16": full,
                "bytes_fraction": frac, "output": "x", "output_tokens": [1, 2, 3],
                "ref_tokens_len": 3, "prefix_agreement": agree, "token_agreement": agree,
                "decode_tokens_per_s": 10.0 + rng.random(), "compaction_ms": 5.0 * (1 - budget),
                "prefill_tokens_per_s": 100.0, "success": success,
            })
    return out


META = {"name": "synthetic", "date": "2024-06-11T00:00:00Z", "command": "test",
        "model": "/m/SmolLM2.gguf", "model_sha256": "ab" * 32, "git_commit": "deadbeef",
        "machine": {"cpus": 2, "cpu_model": "test cpu"}, "seed": 1, "wall_seconds": 3723,
        "bytes_per_token_f16": BYTES_PER_TOKEN, "static_session_bytes": 8192 * BYTES_PER_TOKEN}

FULL_SET = {
    "full@1/f16": None,
    "full@1/f32": None,  # identical outputs to the reference
    "window@0.25/f16": 0.4,
    "h2o@0.25/f16": 0.8,
    "hybrid@0.25/f16": 0.98,
    "hybrid@0.1/f16": 0.9,
    "h2o@0.1/f16": 0.5,
    "hybrid@0.25/K8V4": 0.97,
    "hybrid@0.25/K4V8": 0.9,
    "hybrid@0.25/K4V4": 0.85,
    "hybrid@0.25/K2V2": 0.5,
}


class StatsTest(unittest.TestCase):
    def test_percentile_matches_linear_interpolation(self):
        xs = [1.0, 2.0, 3.0, 4.0]
        self.assertEqual(stats.percentile(xs, 0), 1.0)
        self.assertEqual(stats.percentile(xs, 100), 4.0)
        self.assertAlmostEqual(stats.percentile(xs, 50), 2.5)
        self.assertAlmostEqual(stats.percentile(xs, 25), 1.75)

    def test_ci_contains_point_and_shrinks_with_more_tasks(self):
        rng = random.Random(SEED)
        widths = []
        for n in (20, 80, 320):
            xs = [float(rng.random() < 0.6) for _ in range(n)]
            e = stats.mean_ci(xs)
            self.assertEqual(e.n, n)
            self.assertLessEqual(e.lo, e.value)
            self.assertGreaterEqual(e.hi, e.value)
            widths.append(e.hi - e.lo)
        self.assertGreater(widths[0], widths[1])
        self.assertGreater(widths[1], widths[2])

    def test_ratio_ci_contains_point(self):
        rng = random.Random(SEED + 1)
        den = [float(rng.random() < 0.7) for _ in range(50)]
        num = [d if rng.random() < 0.9 else 0.0 for d in den]
        e = stats.ratio_ci(num, den)
        self.assertLessEqual(e.lo, e.value)
        self.assertGreaterEqual(e.hi, e.value)

    def test_identical_columns(self):
        xs = [1.0, 0.0, 1.0, 1.0, 0.0, 1.0]
        r = stats.ratio_ci(xs, xs)
        self.assertEqual((r.value, r.lo, r.hi), (1.0, 1.0, 1.0))
        d = stats.diff_ci(xs, xs)
        self.assertEqual((d.value, d.lo, d.hi), (0.0, 0.0, 0.0))
        self.assertFalse(d.excludes(0.0))

    def test_deterministic(self):
        xs = [float(i % 3 == 0) for i in range(30)]
        self.assertEqual(stats.mean_ci(xs), stats.mean_ci(xs))

    def test_undefined_ratio_and_empty(self):
        self.assertIsNone(stats.ratio_ci([1.0, 0.0], [0.0, 0.0]).value)
        self.assertEqual(stats.mean_ci([]), stats.EMPTY)
        with self.assertRaises(ValueError):
            stats.bootstrap([[1.0], [1.0, 2.0]], lambda m: m[0])

    def test_align_drops_missing_and_null(self):
        ids, a, b = stats.align({"x": 1, "y": None, "z": 0}, {"x": 0, "y": 1, "w": 1})
        self.assertEqual(ids, ["x"])
        self.assertEqual((a, b), ([1.0], [0.0]))


class AnalysisTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.records = make_records(FULL_SET, num_tasks=24)
        cls.a = report.analyze(cls.records, dict(META), resamples=FAST)

    def test_reference_is_exactly_one(self):
        self.assertEqual(self.a.reference, "full@1/f16")
        e = self.a.per_config["full@1/f16"]["rel_success"]
        self.assertEqual((e.value, e.lo, e.hi), (1.0, 1.0, 1.0))

    def test_identical_config_difference_contains_zero(self):
        az = report.Analyzer(self.records, dict(META), resamples=FAST)
        az.run()
        d = az.rel_diff("full@1/f32", "full@1/f16")
        self.assertEqual(d.value, 0.0)
        self.assertFalse(d.excludes(0.0))
        self.assertEqual(self.a.per_config["full@1/f32"]["rel_success"].value, 1.0)

    def test_relative_success_is_ratio_of_means(self):
        name = "h2o@0.25/f16"
        succ = {r["task"]: r["success"] for r in self.records if r["config"] == name}
        ref = {r["task"]: r["success"] for r in self.records if r["config"] == "full@1/f16"}
        expect = (sum(succ.values()) / len(succ)) / (sum(ref.values()) / len(ref))
        self.assertAlmostEqual(self.a.per_config[name]["rel_success"].value, expect)
        self.assertAlmostEqual(self.a.per_config[name]["bytes_fraction"], 0.25)

    def test_errors_are_counted_and_noted(self):
        recs = make_records({"full@1/f16": None, "h2o@0.25/f16": 0.8}, num_tasks=6)
        for r in recs:
            if r["config"] == "h2o@0.25/f16" and r["task"] == "t001":
                for k in ("bytes_peak", "token_agreement", "output_tokens"):
                    del r[k]
                r["error"], r["success"] = "INTERNAL: boom", False
        a = report.analyze(recs, {}, resamples=FAST)
        self.assertEqual(a.per_config["h2o@0.25/f16"]["n_errors"], 1)
        self.assertEqual(a.per_config["h2o@0.25/f16"]["agreement"].n, 5)
        self.assertTrue(any("INTERNAL: boom" in n for n in a.notes))

    def test_null_success_is_excluded(self):
        recs = make_records({"full@1/f16": None, "h2o@0.25/f16": 0.8}, num_tasks=10)
        for r in recs:
            if r["task"] == "t000":
                r["success"] = None
        a = report.analyze(recs, {}, resamples=FAST)
        self.assertEqual(a.per_config["h2o@0.25/f16"]["n_scored"], 9)
        self.assertEqual(a.per_config["h2o@0.25/f16"]["rel_success"].n, 9)

    def test_order_puts_reference_first(self):
        self.assertEqual(self.a.order[0], "full@1/f16")

    def test_budgets_and_headline(self):
        self.assertEqual([h["budget"] for h in self.a.headline], [0.25, 0.1])
        h = self.a.headline[0]
        self.assertEqual(h["f16_winner"], "hybrid@0.25/f16")
        # Within 25% of the bytes: every f16@0.25 and the quantized ones fit.
        self.assertIn(h["best_within_bytes"], self.a.configs)
        self.assertLessEqual(self.a.per_config[h["best_within_bytes"]]["bytes_fraction"], 0.25)

    def test_keys_values_sentences(self):
        kv = self.a.keys_values
        self.assertEqual(len(kv["k8v4_vs_k4v8"]), 1)
        self.assertEqual(kv["k8v4_vs_k4v8"][0]["a"], "hybrid@0.25/K8V4")
        self.assertEqual(len(kv["sentences"]), 3)
        self.assertIn("K8V4 minus K4V8", kv["sentences"][0])
        self.assertIn("K4V4 vs f16", kv["sentences"][1])
        self.assertIn("K2V2 vs f16", kv["sentences"][2])

    def test_throughput_per_policy_and_formats(self):
        pols = [t["policy"] for t in self.a.throughput if t["by"] == "policy"]
        self.assertEqual(pols[0], "full")
        self.assertEqual(sorted(pols), ["full", "h2o", "hybrid", "window"])
        h2o = next(t for t in self.a.throughput if t.get("policy") == "h2o")
        self.assertEqual(h2o["n_records"], 48)
        hybrid = next(t for t in self.a.throughput if t.get("policy") == "hybrid")
        self.assertEqual(hybrid["n_configs"], 2)  # f16 only
        fmts = {t["formats"]: t["n_configs"] for t in self.a.throughput if t["by"] == "formats"}
        self.assertEqual(fmts, {"f16": 6, "f32": 1, "K8V4": 1, "K4V8": 1, "K4V4": 1, "K2V2": 1})


class WinnerTest(unittest.TestCase):
    def test_clear_winner_is_distinguishable(self):
        recs = make_records({"full@1/f16": None, "good@0.5/f16": 1.0, "bad@0.5/f16": 0.2},
                            num_tasks=60, ref_rate=0.9)
        a = report.analyze(recs, {}, resamples=FAST)
        w = a.winners[0]
        self.assertEqual(w["winner"], "good@0.5/f16")
        self.assertEqual(w["runner_up"], "bad@0.5/f16")
        self.assertTrue(w["distinguishable"])
        self.assertIn("distinguishable", w["sentence"])
        self.assertNotIn("not distinguishable", w["sentence"])

    def test_tie_on_success_broken_by_agreement(self):
        recs = make_records({"full@1/f16": None, "a@0.5/f16": None, "b@0.5/f16": None},
                            num_tasks=12)
        for r in recs:
            if r["config"] == "b@0.5/f16":
                r["token_agreement"] = 0.9
        a = report.analyze(recs, {}, resamples=FAST)
        w = a.winners[0]
        self.assertEqual(w["winner"], "a@0.5/f16")
        self.assertTrue(w["tied_on_success"])
        self.assertFalse(w["distinguishable"])
        self.assertIn("token agreement decides", w["sentence"])

    def test_only_f16_configs_compete(self):
        recs = make_records({"full@1/f16": None, "x@0.25/K4V4": 1.0, "y@0.25/f16": 0.5},
                            num_tasks=10)
        a = report.analyze(recs, {}, resamples=FAST)
        self.assertEqual(a.winners[0]["ranking"], ["y@0.25/f16"])
        self.assertIsNone(a.winners[0]["runner_up"])


class TargetCapacityTest(unittest.TestCase):
    def records(self):
        # Two configs under 10% of the bytes; "cheap" solves everything the
        # reference does, "cheaper" half of it.
        recs = []
        for i in range(10):
            base = {"task": f"t{i}", "family": "recall", "bytes_full_f16": 1000 * MiB_,
                    "token_agreement": 1.0}
            recs.append({**base, "config": "full@1/f16", "policy": "full", "budget": 1,
                         "formats": "f16", "bytes_peak": 1000 * MiB_, "success": True})
            recs.append({**base, "config": "hybrid@0.1/K8V4", "policy": "hybrid", "budget": 0.1,
                         "formats": "K8V4", "bytes_peak": 50 * MiB_, "success": True})
            recs.append({**base, "config": "hybrid@0.05/K2V2", "policy": "hybrid",
                         "budget": 0.05, "formats": "K2V2", "bytes_peak": 10 * MiB_,
                         "success": i % 2 == 0})
        return recs

    def test_target_and_capacity_arithmetic(self):
        meta = {"static_session_bytes": 4000 * MiB_}
        a = report.analyze(self.records(), meta, resamples=FAST)
        t = a.target
        self.assertEqual(t["best"], "hybrid@0.1/K8V4")
        self.assertAlmostEqual(t["bytes_fraction"], 0.05)
        self.assertAlmostEqual(t["gap"], 1.0 - 0.97)
        self.assertTrue(t["met_point"])
        self.assertTrue(t["met_ci_lower"])
        c = a.capacity
        self.assertEqual(c["best_meeting"]["config"], "hybrid@0.1/K8V4")
        self.assertAlmostEqual(c["best_meeting"]["vs_static"], 80.0)
        self.assertAlmostEqual(c["best_meeting"]["vs_paged"], 20.0)
        self.assertEqual(c["cheapest"]["config"], "hybrid@0.05/K2V2")
        self.assertAlmostEqual(c["cheapest"]["vs_static"], 400.0)
        self.assertIn("not a live daemon run", c["sentence"])
        self.assertIn("target is met", c["sentence"])

    def test_bytes_fraction_computed_when_absent(self):
        a = report.analyze(self.records(), {}, resamples=FAST)
        self.assertAlmostEqual(a.per_config["hybrid@0.05/K2V2"]["bytes_fraction"], 0.01)

    def test_static_bytes_sources(self):
        recs = self.records()
        az = report.Analyzer(recs, {"static_session_bytes": 7}, resamples=FAST)
        self.assertEqual(az.static_session_bytes()[0], 7)
        az = report.Analyzer(recs, {"bytes_per_token_f16": 100, "max_context_tokens": 10},
                             resamples=FAST)
        self.assertEqual(az.static_session_bytes()[0], 1000)
        az = report.Analyzer(recs, {"bytes_per_token_f16": 100}, resamples=FAST)
        self.assertEqual(az.static_session_bytes()[0], 8192 * 100)
        for r in recs:
            r["context_tokens"], r["question_tokens"], r["output_tokens"] = 1000, 0, []
        az = report.Analyzer(recs, {}, resamples=FAST)
        az.run()
        got, src = az.static_session_bytes()
        self.assertAlmostEqual(got, 8192 * (1000 * MiB_ / 1000))
        self.assertIn("estimated", src)

    def test_target_missed(self):
        recs = [r for r in self.records() if r["config"] != "hybrid@0.1/K8V4"]
        a = report.analyze(recs, {"static_session_bytes": 4000 * MiB_}, resamples=FAST)
        self.assertEqual(a.target["best"], "hybrid@0.05/K2V2")
        self.assertFalse(a.target["met_point"])
        self.assertLess(a.target["gap"], 0)
        self.assertIn("misses the target", a.target["sentence"])
        # Only the reference reaches 0.97, so it is the best meeting the bar.
        self.assertEqual(a.capacity["best_meeting"]["config"], "full@1/f16")

    def test_pareto_front(self):
        pts = [(0.1, 0.5), (0.2, 0.4), (0.3, 0.9), (0.05, 0.5), (1.0, 1.0), (0.5, 0.9)]
        self.assertEqual(report.pareto_front(pts), [(0.05, 0.5), (0.3, 0.9), (1.0, 1.0)])


MiB_ = 1024 * 1024


def read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


class ReportFileTest(unittest.TestCase):
    def write(self, d, records, meta):
        with open(os.path.join(d, "scored.jsonl"), "w") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
        with open(os.path.join(d, "meta.json"), "w") as f:
            json.dump(meta, f)

    def test_full_report_mentions_every_section(self):
        with tempfile.TemporaryDirectory() as d:
            self.write(d, make_records(FULL_SET, num_tasks=20), META)
            report.write_report(d, resamples=FAST, plots=False)
            md = read(os.path.join(d, "report.md"))
            for s in ("# polykv agentic evaluation: synthetic", "deadbeef", "1:02:03",
                      "## Headline", "## Answers", "Which policy wins at each budget",
                      "Keys or values", "### Target", "## All configs", "## Per family",
                      "## Throughput and overhead", "## Plots", "## Notes",
                      "hybrid@0.25/K2V2", "not a live daemon run"):
                self.assertIn(s, md)
            summary = json.loads(read(os.path.join(d, "summary.json")))
            self.assertEqual(summary["reference"], "full@1/f16")
            self.assertEqual(len(summary["configs"]), len(FULL_SET))
            self.assertEqual(summary["configs"][0]["rel_success"]["value"], 1.0)
            self.assertTrue(summary["summary"])

    def test_negotiation_cost_per_token(self):
        rpc = {"clients_1": {"reserve_commit": {"p50_us": 400.0, "p99_us": 900.0},
                             "echo": {"p50_us": 150.0, "p99_us": 300.0}},
               "clients_8": {"reserve_commit": {"p50_us": 1800.0, "p99_us": 5000.0},
                             "echo": {"p50_us": 800.0, "p99_us": 2000.0}}}
        with tempfile.TemporaryDirectory() as d:
            self.write(d, make_records(FULL_SET, num_tasks=8), META)
            with open(os.path.join(d, "rpc.json"), "w") as f:
                json.dump(rpc, f)
            a = report.write_report(d, resamples=FAST, plots=False)
            md = read(os.path.join(d, "report.md"))
        ng = a.negotiation
        self.assertEqual(ng["per_token_us"], 400.0 / report.COMMIT_EVERY_STEPS)
        ref = next(t for t in a.throughput if t["by"] == "policy" and t["policy"] == "full")
        self.assertAlmostEqual(ng["share_of_decode_step"],
                               50.0 / (1e6 / ref["decode_tokens_per_s"]))
        self.assertIn("reserve+commit round trip", md)
        self.assertIn("p50 1800 µs with 8 clients", md)
        with tempfile.TemporaryDirectory() as d:
            self.write(d, make_records(FULL_SET, num_tasks=8), META)
            with open(os.path.join(d, "rpc.json"), "w") as f:
                f.write("{}")
            a = report.write_report(d, resamples=FAST, plots=False)
        self.assertEqual(a.negotiation, {})
        self.assertTrue(any("rpc.json is not usable" in n for n in a.notes))

    def test_graceful_skips(self):
        recs = make_records({"full@1/f16": None, "h2o@0.25/f16": 0.8}, num_tasks=8)
        with tempfile.TemporaryDirectory() as d:
            self.write(d, recs, {"name": "tiny"})
            a = report.write_report(d, resamples=FAST, plots=False)
            md = read(os.path.join(d, "report.md"))
            self.assertIn("_Skipped: the run has no K8V4/K4V8 pair", md)
            self.assertTrue(any("K8V4 and K4V8" in n for n in a.notes))
            self.assertIn("## Headline", md)
            self.assertIn("only h2o ran", md)

    def test_no_reference_and_no_compressed(self):
        recs = make_records({"full@1/f32": None}, num_tasks=6)
        with tempfile.TemporaryDirectory() as d:
            self.write(d, recs, {})
            a = report.write_report(d, resamples=FAST, plots=False)
            md = read(os.path.join(d, "report.md"))
            self.assertIsNone(a.reference)
            self.assertIn("reference config full@1/f16 is missing", md)
            self.assertIn("_Skipped: no compressed config", md)

    def test_all_success_null(self):
        recs = make_records({"full@1/f16": None, "h2o@0.25/f16": 0.5}, num_tasks=6)
        for r in recs:
            r["success"] = None
        with tempfile.TemporaryDirectory() as d:
            self.write(d, recs, {})
            a = report.write_report(d, resamples=FAST, plots=False)
            self.assertIsNone(a.per_config["h2o@0.25/f16"]["rel_success"].value)
            self.assertIn("n/a", read(os.path.join(d, "report.md")))

    def test_bad_jsonl_line_is_an_error(self):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "scored.jsonl"), "w") as f:
                f.write('{"task": "a"}\n{oops\n')
            with self.assertRaises(SystemExit) as cm:
                report.write_report(d, resamples=FAST, plots=False)
            self.assertIn(":2:", str(cm.exception))

    @unittest.skipUnless(HAVE_MPL, "matplotlib not importable")
    def test_plots_written(self):
        with tempfile.TemporaryDirectory() as d:
            self.write(d, make_records(FULL_SET, num_tasks=16), META)
            a = report.write_report(d, resamples=FAST, plots=True)
            md = read(os.path.join(d, "report.md"))
            for f in ("pareto.png", "agreement.png", "capacity.png", "budgets.png"):
                path = os.path.join(d, f)
                self.assertTrue(os.path.exists(path), f)
                with open(path, "rb") as fh:
                    self.assertEqual(fh.read(8), b"\x89PNG\r\n\x1a\n")
                self.assertIn(f"]({f})", md)
            self.assertFalse(any("matplotlib" in n for n in a.notes))

    @unittest.skipIf(HAVE_MPL, "matplotlib is importable")
    def test_plots_skipped_without_matplotlib(self):
        with tempfile.TemporaryDirectory() as d:
            self.write(d, make_records(FULL_SET, num_tasks=8), META)
            a = report.write_report(d, resamples=FAST, plots=True)
            self.assertTrue(any("matplotlib is not importable" in n for n in a.notes))


def live_records(with_k8v4: bool = True) -> list[dict]:
    """Four tasks with known token counts: the reference holds its whole
    context, hybrid@0.1/K8V4 (records in the removed harness's int8/int4 names)
    solves all of them, hybrid@0.05/K2V2 (only the config's formats) half,
    plus one errored K2V2 record whose counts must not be averaged."""
    recs = []
    for i in range(4):
        base = {"task": f"t{i}", "family": "recall", "bytes_full_f16": 1000 * MiB_,
                "token_agreement": 1.0, "context_tokens": 1000 + i,
                "question_tokens": 40 + i % 2, "output_tokens": [7] * (3 + i % 2)}
        # kept_slots_mean 1 on the reference: its context_tokens must be used.
        recs.append({**base, "config": "full@1/f16", "policy": "full", "budget": 1,
                     "formats": "f16", "k_format": "f16", "v_format": "f16",
                     "kept_slots_mean": 1, "bytes_peak": 1000 * MiB_, "success": True})
        if with_k8v4:
            recs.append({**base, "config": "hybrid@0.1/K8V4", "policy": "hybrid", "budget": 0.1,
                         "formats": "K8V4", "k_format": "int8", "v_format": "int4",
                         "kept_slots_mean": 100.5 + i, "bytes_peak": 50 * MiB_,
                         "success": True})
        recs.append({**base, "config": "hybrid@0.05/K2V2", "policy": "hybrid", "budget": 0.05,
                     "formats": "K2V2", "kept_slots_mean": 50.25, "bytes_peak": 10 * MiB_,
                     "success": i % 2 == 0})
    recs.append({"task": "t9", "family": "recall", "config": "hybrid@0.05/K2V2",
                 "policy": "hybrid", "budget": 0.05, "formats": "K2V2", "context_tokens": 9000,
                 "kept_slots_mean": 9000, "error": "INTERNAL: boom", "success": None})
    return recs


LIVE_META = {"static_session_bytes": 4000 * MiB_, "max_context_tokens": 4096}


def live_json(admitted: dict, tokens: dict, pool_mib: int = 1024) -> dict:
    return {"bench": "capacity", "pool_bytes": pool_mib * MiB_,
            "profile": {"layers": 30, "kv_heads": 3, "head_dim": 64},
            "strategies": [{"name": n, "tokens": tokens[n], "session_bytes": 1000 * tokens[n],
                            "admitted": a,
                            "pool_over_session_bytes": pool_mib * MiB_ / (1000 * tokens[n])}
                           for n, a in admitted.items()]}


# Means of (held + question + answer + 2) over t0..t3, rounded up:
# reference (1045 + 1048 + 1047 + 1050) / 4 = 1047.5; K8V4 exactly 148;
# K2V2 96.25.
LIVE_TOKENS = {"static": 4096, "paged": 1048, "polykv:hybrid@0.1/K8V4": 148,
               "polykv:hybrid@0.05/K2V2": 97}


class LiveCapacityTest(unittest.TestCase):
    def test_live_inputs(self):
        a = report.analyze(live_records(), dict(LIVE_META), resamples=FAST)
        li = a.capacity["live_inputs"]
        self.assertEqual([e["name"] for e in li], list(LIVE_TOKENS))
        self.assertEqual({e["name"]: e["tokens"] for e in li}, LIVE_TOKENS)
        self.assertTrue(all(isinstance(e["tokens"], int) for e in li))
        got = {e["name"]: (e["config"], e["roles"], e["k_format"], e["v_format"]) for e in li}
        self.assertEqual(got, {
            "static": (None, ["static"], "f16", "f16"),
            "paged": ("full@1/f16", ["paged"], "f16", "f16"),
            "polykv:hybrid@0.1/K8V4": ("hybrid@0.1/K8V4", ["best_meeting"], "int8", "int4"),
            "polykv:hybrid@0.05/K2V2": ("hybrid@0.05/K2V2", ["cheapest"], "int2", "int2"),
        })

    def test_live_inputs_static_default_and_reference_as_best(self):
        # Without K8V4 only the reference reaches 0.97: it is measured once,
        # as paged, carrying both roles.
        a = report.analyze(live_records(with_k8v4=False), {}, resamples=FAST)
        li = a.capacity["live_inputs"]
        self.assertEqual([e["name"] for e in li], ["static", "paged", "polykv:hybrid@0.05/K2V2"])
        self.assertEqual(li[0]["tokens"], 8192)
        self.assertEqual(li[1]["roles"], ["paged", "best_meeting"])

    def test_bench_formats(self):
        self.assertEqual(report.bench_formats("int8", "int4", "K8V4"), ("int8", "int4"))
        self.assertEqual(report.bench_formats("K4V8", "K4V8", "K4V8"), ("int4", "int8"))
        self.assertEqual(report.bench_formats("", "", "f32"), ("f32", "f32"))
        self.assertIsNone(report.bench_formats("", "", "K3V3"))
        self.assertEqual(report.live_name("a=b@1/f16", "full@1/f16"), "polykv:a-b@1/f16")

    def write(self, d, live=None, raw=None):
        ReportFileTest.write(None, d, live_records(), LIVE_META)
        path = os.path.join(d, report.LIVE_CAPACITY_FILE)
        if live is not None:
            with open(path, "w") as f:
                json.dump(live, f)
        elif raw is not None:
            with open(path, "w") as f:
                f.write(raw)

    def test_live_table_and_ratios(self):
        live = live_json({"static": 4, "paged": 16, "polykv:hybrid@0.1/K8V4": 100,
                          "polykv:hybrid@0.05/K2V2": 300}, LIVE_TOKENS)
        with tempfile.TemporaryDirectory() as d:
            self.write(d, live)
            report.write_report(d, resamples=FAST, plots=False)
            md = read(os.path.join(d, "report.md"))
            summary = json.loads(read(os.path.join(d, "summary.json")))
        self.assertIn("#### Computed from per-session peak bytes", md)
        self.assertIn("#### Measured on a live polykvd (pool 1024 MiB)", md)
        row = next(x for x in md.splitlines() if x.startswith("| polykv:hybrid@0.1/K8V4 |"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        self.assertEqual(cells[2:4], ["148", "int8/int4"])
        self.assertEqual(cells[5], "100")
        self.assertEqual(cells[7:], ["25.0×", "6.25×"])
        row = next(x for x in md.splitlines() if x.startswith("| polykv:hybrid@0.05/K2V2 |"))
        self.assertTrue(row.rstrip().endswith("| 75.0× | 18.8× |"), row)
        self.assertIn("**25.0×** static — the ≥ 8× target is met", md)
        self.assertIn("Static fits only 4 sessions", md)
        lv = summary["capacity"]["live"]
        self.assertEqual(lv["pool_bytes"], 1024 * MiB_)
        self.assertEqual((lv["static_admitted"], lv["paged_admitted"]), (4, 16))
        self.assertEqual(lv["best_meeting"]["config"], "hybrid@0.1/K8V4")
        self.assertAlmostEqual(lv["best_meeting"]["vs_static"], 25.0)
        self.assertAlmostEqual(lv["best_meeting"]["vs_paged"], 6.25)
        self.assertTrue(lv["target_met"])
        # The computed figures stay beside the measured ones.
        self.assertAlmostEqual(summary["capacity"]["best_meeting"]["vs_static"], 80.0)
        self.assertIn("live polykvd", summary["summary"])

    def test_live_target_missed_and_stale_tokens(self):
        tokens = dict(LIVE_TOKENS, **{"polykv:hybrid@0.1/K8V4": 150})
        live = live_json({"static": 40, "paged": 160, "polykv:hybrid@0.1/K8V4": 200}, tokens)
        with tempfile.TemporaryDirectory() as d:
            self.write(d, live)
            a = report.write_report(d, resamples=FAST, plots=False)
            md = read(os.path.join(d, "report.md"))
        self.assertIn("**5.00×** static — the ≥ 8× target is not met", md)
        self.assertNotIn("Static fits only", md)
        self.assertFalse(a.capacity["live"]["target_met"])
        self.assertTrue(any("measured at 150 tokens" in n and "now give 148" in n
                            for n in a.notes))

    def test_missing_file_means_no_live_section(self):
        with tempfile.TemporaryDirectory() as d:
            self.write(d)
            a = report.write_report(d, resamples=FAST, plots=False)
            md = read(os.path.join(d, "report.md"))
            summary = json.loads(read(os.path.join(d, "summary.json")))
        self.assertNotIn("live polykvd", md)
        self.assertNotIn("live", summary["capacity"])
        self.assertEqual(len(summary["capacity"]["live_inputs"]), 4)
        self.assertFalse(any("live capacity" in n for n in a.notes))

    def test_failed_or_unreadable_measurement_is_a_note(self):
        for live, raw, want in (({"bench": "capacity", "error": "polykv-bench capacity exited 1"},
                                 None, "exited 1"),
                                (None, "{oops", "not readable JSON")):
            with tempfile.TemporaryDirectory() as d:
                self.write(d, live, raw)
                report.write_report(d, resamples=FAST, plots=False)
                md = read(os.path.join(d, "report.md"))
            self.assertNotIn("Measured on a live polykvd", md)
            self.assertIn("the live capacity measurement failed", md)
            self.assertIn(want, md)

    @unittest.skipUnless(HAVE_MPL, "matplotlib not importable")
    def test_plot_with_live_points(self):
        live = live_json({"static": 0, "paged": 16, "polykv:hybrid@0.1/K8V4": 100}, LIVE_TOKENS)
        with tempfile.TemporaryDirectory() as d:
            self.write(d, live)
            a = report.write_report(d, resamples=FAST, plots=True)
            self.assertTrue(os.path.exists(os.path.join(d, "capacity.png")))
            md = read(os.path.join(d, "report.md"))
        self.assertIn("stars measured on a live polykvd", md)
        # No static session fits: the ratio is undefined, not a division error.
        self.assertIsNone(a.capacity["live"]["best_meeting"]["vs_static"])
        self.assertIn("ratio to static is undefined", md)


FAKE_BENCH = """#!{python}
import json, sys
args = sys.argv[1:]
if {fail}:
    print("capacity: something broke", file=sys.stderr)
    sys.exit(3)
pool = int(args[args.index("--pool-mib") + 1]) << 20
out = []
for i, a in enumerate(args):
    if a == "--session":
        name, _, rest = args[i + 1].partition("=")
        tokens = int(rest.split(":")[0])
        n = pool // (tokens * 1000)
        print("polykvd log line", file=sys.stderr)
        print(f"\\rcapacity {{name}}: 1 sessions\\rcapacity {{name}}: {{n}} sessions admitted",
              file=sys.stderr)
        out.append({{"name": name, "tokens": tokens, "session_bytes": tokens * 1000,
                    "admitted": n, "pool_over_session_bytes": pool / (tokens * 1000)}})
print(json.dumps({{"bench": "capacity", "pool_bytes": pool, "strategies": out}}))
"""


class DriverTest(unittest.TestCase):
    def test_live_capacity_flags(self):
        args = driver.parse_args([])
        self.assertFalse(args.no_live_capacity)
        self.assertEqual(args.capacity_pool_mib, 1024)
        args = driver.parse_args(["--no-live-capacity", "--capacity-pool-mib", "2048"])
        self.assertTrue(args.no_live_capacity)
        self.assertEqual(args.capacity_pool_mib, 2048)

    def test_capacity_session_args(self):
        a = report.analyze(live_records(), dict(LIVE_META), resamples=FAST)
        summary = json.loads(json.dumps(report.summary_json(a, {})))
        self.assertEqual(driver.capacity_session_args(summary), [
            "static=4096:f16:f16", "paged=1048:f16:f16",
            "polykv:hybrid@0.1/K8V4=148:int8:int4", "polykv:hybrid@0.05/K2V2=97:int2:int2"])
        odd = {"capacity": {"live_inputs": [
            {"name": "a=b", "tokens": 5, "k_format": "f16", "v_format": "f16"},
            {"name": "bad", "tokens": 5, "k_format": "K8", "v_format": "f16"},
            {"name": "zero", "tokens": 0, "k_format": "f16", "v_format": "f16"},
            {"name": "none"}]}}
        self.assertEqual(driver.capacity_session_args(odd), ["a-b=5:f16:f16"])
        self.assertEqual(driver.capacity_session_args({}), [])

    def fake_bench(self, d, fail):
        path = os.path.join(d, "fake-bench")
        with open(path, "w") as f:
            f.write(FAKE_BENCH.format(python=sys.executable, fail=fail))
        os.chmod(path, 0o755)
        return path

    def test_measure_live_capacity_then_report(self):
        with tempfile.TemporaryDirectory() as d:
            ReportFileTest.write(None, d, live_records(), LIVE_META)
            report.write_report(d, resamples=FAST, plots=False)
            warning = driver.measure_live_capacity(d, 64, bench=self.fake_bench(d, False))
            self.assertIsNone(warning)
            live = json.loads(read(os.path.join(d, "capacity_live.json")))
            self.assertEqual(live["pool_bytes"], 64 * MiB_)
            self.assertEqual({s["name"]: s["tokens"] for s in live["strategies"]}, LIVE_TOKENS)
            self.assertIn("polykvd log line", read(os.path.join(d, "capacity_live.log")))
            self.assertFalse(os.path.exists(os.path.join(d, "capacity_live.json.tmp")))
            report.write_report(d, resamples=FAST, plots=False)
            md = read(os.path.join(d, "report.md"))
            # static: 64 MiB // 4096000 B = 16; K8V4: // 148000 = 453
            self.assertIn("#### Measured on a live polykvd (pool 64 MiB)", md)
            self.assertIn("had 453 sessions admitted against 16", md)

    def test_failing_bench_is_a_warning(self):
        with tempfile.TemporaryDirectory() as d:
            ReportFileTest.write(None, d, live_records(), LIVE_META)
            report.write_report(d, resamples=FAST, plots=False)
            warning = driver.measure_live_capacity(d, 64, bench=self.fake_bench(d, True))
            self.assertIn("exited 3: capacity: something broke", warning)
            self.assertIn("exited 3", json.loads(read(os.path.join(d, "capacity_live.json")))["error"])
            a = report.write_report(d, resamples=FAST, plots=False)
            self.assertTrue(any(n.startswith("warning: the live capacity measurement failed")
                                for n in a.notes))
            missing = driver.measure_live_capacity(d, 64, bench=os.path.join(d, "nope"))
            self.assertIn("could not run", missing)

    def test_stuck_bench_is_killed(self):
        with tempfile.TemporaryDirectory() as d:
            ReportFileTest.write(None, d, live_records(), LIVE_META)
            report.write_report(d, resamples=FAST, plots=False)
            bench = os.path.join(d, "stuck-bench")
            with open(bench, "w") as f:
                f.write("#!/bin/sh\nexec sleep 30\n")
            os.chmod(bench, 0o755)
            warning = driver.measure_live_capacity(d, 64, bench=bench, timeout_s=0.5)
            self.assertIn("killed after 0.5 s", warning)

    def test_live_capacity_skipped_without_summary(self):
        with tempfile.TemporaryDirectory() as d:
            self.assertIn("summary.json", driver.measure_live_capacity(d, 64, bench="/bin/false"))
            self.assertFalse(os.path.exists(os.path.join(d, "capacity_live.json")))

    def test_presets(self):
        quick = driver.expand_preset("quick")
        self.assertEqual(quick["configs"][0], "full@1/f16")
        self.assertEqual(len(quick["configs"]), 14)
        self.assertIn("hybrid@0.25/K2V2", quick["configs"])
        self.assertEqual(quick["per_family"]["multiagent"], 4)
        self.assertEqual(quick["per_family"]["recall"], 2)
        full = driver.expand_preset("full")
        self.assertEqual(len(full["configs"]), len(set(full["configs"])))
        # every policy x 4 budgets at f16; 4 formats x 3 budgets for one
        # policy; 4 formats without eviction; the reference
        self.assertEqual(len(full["configs"]), 1 + 9 * 4 + 4 * 3 + 4)
        self.assertIn("sinks+structural+intent@0.05/f16", full["configs"])
        self.assertIn("hybrid@0.05/K2V2", full["configs"])
        self.assertIn("full@1/K4V4", full["configs"])
        for c in full["configs"]:
            p, b, f = report.parse_config(c)
            self.assertIsNotNone(b, c)
            self.assertIn(f, FORMAT_BYTES, c)

    def test_per_family_overrides(self):
        base = {"recall": 2, "multiagent": 4}
        got = driver.per_family_counts(["recall", "multiagent", "tools"], base, ["3"])
        self.assertEqual(got, {"recall": 3, "multiagent": 3, "tools": 3})
        got = driver.per_family_counts(["recall", "multiagent"], base, ["5", "multiagent=9"])
        self.assertEqual(got, {"recall": 5, "multiagent": 9})
        got = driver.per_family_counts(["recall", "tools"], {"*": 2, "recall": 1}, None)
        self.assertEqual(got, {"recall": 1, "tools": 2})
        with self.assertRaises(SystemExit):
            driver.per_family_counts(["recall"], base, ["x=1"])

    def test_merge_manifests(self):
        with tempfile.TemporaryDirectory() as d:
            src, dst = os.path.join(d, ".gen-1"), os.path.join(d, "tasks")
            os.makedirs(src)
            os.makedirs(dst)
            for folder, tid in ((dst, "recall-000"), (src, "multiagent-g00-a00")):
                with open(os.path.join(folder, f"{tid}.jsonl"), "w") as f:
                    f.write("{}\n")
                with open(os.path.join(folder, "manifest.json"), "w") as f:
                    json.dump([{"task_id": tid}], f)
            driver.merge_into(src, dst)
            self.assertFalse(os.path.exists(src))
            self.assertEqual(sorted(os.listdir(dst)),
                             ["manifest.json", "multiagent-g00-a00.jsonl", "recall-000.jsonl"])
            ids = [e["task_id"] for e in json.loads(read(os.path.join(dst, "manifest.json")))]
            self.assertEqual(ids, ["recall-000", "multiagent-g00-a00"])

    def test_gen_groups(self):
        groups = driver.gen_groups({"recall": 2, "coding": 2, "multiagent": 4})
        self.assertEqual(groups, [(2, ["recall", "coding"]), (4, ["multiagent"])])


if __name__ == "__main__":
    unittest.main()
