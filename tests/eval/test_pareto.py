"""bench/eval/pareto.py without matplotlib: which configs are plotted, their
series, the table, and a run without a summary."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench", "eval"))

import pareto  # noqa: E402


def cfg(name, rel, bytes_fraction, reference=False, lo=None, hi=None):
    return {"config": name, "reference": reference, "bytes_fraction": bytes_fraction,
            "rel_success": {"value": rel, "lo": lo, "hi": hi},
            "kl": {"value": 0.01, "lo": 0.005, "hi": 0.02}, "top1": {"value": 0.97}}


class ParetoTest(unittest.TestCase):
    def test_the_reference_and_configs_without_a_score_are_not_plotted(self):
        cs = [cfg("full@1/f16", 1.0, 1.0, reference=True), cfg("full@1/K4V4/T64", 1.0, 0.3),
              cfg("h2o@0.1/f16", None, 0.1), cfg("x@0.5/f16", 0.5, None)]
        self.assertEqual([c["config"] for c in pareto.points(cs)], ["full@1/K4V4/T64"])

    def test_a_series_is_the_config_without_its_budget(self):
        self.assertEqual(pareto.family("kvpress-snapkv@0.3/f16"), "kvpress-snapkv/f16")
        self.assertEqual(pareto.family("full@1/K4V2/T64/R64"), "full/K4V2/T64/R64")
        self.assertEqual(pareto.family("window"), "window")

    def test_the_table_lists_each_run_by_bytes_with_intervals(self):
        runs = [("polykv", [cfg("full@1/K4V4/T64", 1.0, 0.30, lo=1.0, hi=1.0)]),
                ("kvpress", [cfg("kvpress-kvzip@0.3/f16", 0.8, 0.31),
                             cfg("kvpress-kvzip@0.1/f16", 0.2, 0.13)])]
        lines = pareto.table(runs).splitlines()
        self.assertEqual(len(lines), 2 + 3)
        self.assertIn("| polykv | `full@1/K4V4/T64` | 0.300 | 1.000 [1.000, 1.000] |", lines[2])
        self.assertIn("`kvpress-kvzip@0.1/f16` | 0.130 | 0.200 |", lines[3])
        self.assertIn("0.0100 [0.0050, 0.0200]", lines[3])

    def test_a_run_without_a_summary_is_an_error_naming_it(self):
        with tempfile.TemporaryDirectory() as d:
            with self.assertRaisesRegex(SystemExit, "summary.json not found"):
                pareto.load_run(d + "=x")
            with open(os.path.join(d, "summary.json"), "w") as f:
                json.dump({"configs": [cfg("a@0.5/f16", 1.0, 0.5)]}, f)
            label, cs = pareto.load_run(d + "=mine")
        self.assertEqual((label, len(cs)), ("mine", 1))


if __name__ == "__main__":
    unittest.main()
