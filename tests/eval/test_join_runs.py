"""Tests for bench/eval/join_runs.py: runs screened separately (overlapping
task ids) joined into one folder that report.py reads as one run.

Run from the repository root: python3 -m unittest tests/eval/test_join_runs.py -v
"""

from __future__ import annotations

import gzip
import json
import os
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench", "eval"))
sys.path.insert(0, os.path.join(ROOT, "tests", "eval"))

import join_runs  # noqa: E402
import report  # noqa: E402
from test_report import FAST, make_records  # noqa: E402

CONFIGS = {"full@1/f16": None, "kvzip@0.5/K8V4": 0.9}


def write_run(folder: str, seed: int, sha: str = "abc", gz: bool = False) -> list[dict]:
    os.makedirs(folder)
    records = [dict(r, mode="live") for r in make_records(CONFIGS, num_tasks=12, seed=seed)]
    opener, name = (gzip.open, "scored.jsonl.gz") if gz else (open, "scored.jsonl")
    with opener(os.path.join(folder, name), "wt", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    meta = {"name": os.path.basename(folder), "seed": seed, "split": "test",
            "model_sha256": sha, "bytes_per_token_f16": 23040, "git_commit": f"c{seed}",
            "command": f"eval.py --seed {seed}", "wall_seconds": 100.0}
    with open(os.path.join(folder, "meta.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f)
    return records


class JoinRunsTest(unittest.TestCase):
    def test_joined_records_keep_every_task_apart_and_report_as_one_run(self):
        with tempfile.TemporaryDirectory() as d:
            a = write_run(os.path.join(d, "s2"), 2)
            b = write_run(os.path.join(d, "s4"), 4, gz=True)
            self.assertEqual({r["task"] for r in a}, {r["task"] for r in b})  # ids overlap
            dst = os.path.join(d, "joined")
            self.assertEqual(join_runs.main([dst, os.path.join(d, "s2"), f"x={d}/s4"]), 0)
            joined = report.load_records(os.path.join(dst, "scored.jsonl"))
            self.assertEqual(len(joined), len(a) + len(b))
            self.assertEqual({r["task"] for r in joined},
                             {f"s2/{r['task']}" for r in a} | {f"x/{r['task']}" for r in b})
            meta = report.load_meta(os.path.join(dst, "meta.json"))
            self.assertEqual([r["label"] for r in meta["runs"]], ["s2", "x"])
            self.assertEqual(meta["seed"], "2, 4")
            self.assertEqual(meta["wall_seconds"], 200.0)
            result = report.analyze(joined, meta, FAST, 1)
            self.assertEqual(result.reference, "full@1/f16")
            ref_tasks = {r["task"] for r in joined if r["config"] == "full@1/f16"}
            self.assertEqual(len(ref_tasks), 24)

    def test_refuses_runs_of_different_models_and_writes_nothing(self):
        with tempfile.TemporaryDirectory() as d:
            write_run(os.path.join(d, "s2"), 2, sha="abc")
            write_run(os.path.join(d, "s4"), 4, sha="def")
            dst = os.path.join(d, "joined")
            with self.assertRaises(SystemExit) as cm:
                join_runs.main([dst, os.path.join(d, "s2"), os.path.join(d, "s4")])
            self.assertIn("model_sha256", str(cm.exception))
            self.assertFalse(os.path.exists(dst))

    def test_refuses_equal_labels_an_existing_destination_and_a_run_without_records(self):
        with tempfile.TemporaryDirectory() as d:
            write_run(os.path.join(d, "a", "run"), 2)
            write_run(os.path.join(d, "b", "run"), 4)
            dst = os.path.join(d, "joined")
            for argv, what in (([dst, f"{d}/a/run", f"{d}/b/run"], "labels must differ"),
                               ([d, f"{d}/a/run", f"{d}/b/run"], "exists"),
                               ([dst, f"{d}/a/run", f"{d}/a"], "no scored.jsonl")):
                with self.assertRaises(SystemExit) as cm:
                    join_runs.main(argv)
                self.assertIn(what, str(cm.exception))
            self.assertFalse(os.path.exists(dst))


if __name__ == "__main__":
    unittest.main()
