"""eval.py end to end (ctest eval_live_test; not in the discover run, as it
needs the binaries and the model).

One SmolLM2 recall task of ~600 tokens under full@1/f16, window@0.5/f16, a
policy the daemon refuses and full@1/K4V2/T32 (32-token pages, the default
128-token f16 recent window), on a live polykvd. Checks that the records are
well-formed, that the refusal is an error carrying the daemon's message, that
the window session was compacted, and that --resume runs nothing twice. About
30 s on 2 cores.

  POLYKV_BIN_DIR=build/bin python3 tests/eval/live_e2e.py -v
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import unittest

from missing_input import missing_input

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EVAL_PY = os.path.join(ROOT, "bench", "eval", "eval.py")
BIN_DIR = os.environ.get("POLYKV_BIN_DIR") or os.path.join(ROOT, "build", "bin")
MODEL_DIR = os.environ.get("POLYKV_MODEL_DIR") or os.path.join(
    os.path.expanduser("~"), ".cache", "polykv", "models")
MODEL = os.path.join(MODEL_DIR, "SmolLM2-135M-Instruct.Q4_1.gguf")
sys.path.insert(0, os.path.join(ROOT, "bench", "eval"))
import live  # noqa: E402

CONFIGS = ["full@1/f16", "window@0.5/f16", "nosuchpolicy@0.5/f16", "full@1/K4V2/T32"]


def read(path):
    with open(path) as f:
        return f.read()


def read_jsonl(path):
    return [json.loads(x) for x in read(path).splitlines() if x.strip()]


class LiveEndToEndTest(unittest.TestCase):
    def setUp(self):
        missing = [b for b in ("polykvd", "polykv-worker", "polykvctl")
                   if not os.access(os.path.join(BIN_DIR, b), os.X_OK)]
        if missing:
            missing_input(f"not built in {BIN_DIR}: {', '.join(missing)}")
        if not os.path.exists(MODEL):
            missing_input("run scripts/fetch-model.sh smollm2-135m")

    def eval_py(self, out, *extra, configs=CONFIGS):
        cmd = [sys.executable, EVAL_PY, "--skip-build", "--no-plots",
               "--no-live-capacity", "--bin-dir", BIN_DIR, "--model", MODEL,
               "--families", "recall", "--per-family", "1", "--min-tokens", "600",
               "--max-tokens", "650", "--configs", ",".join(configs), "--threads", "2",
               "--out", out, "--name", "live", *extra]
        p = subprocess.run(cmd, cwd=ROOT, text=True, capture_output=True)
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        return p

    def test_the_compaction_trigger_comes_from_polykvd(self):
        # live.py checks that a session compacted by the daemon's own trigger
        # (the shipped default's is 1, h2o's 1.10), not by a copy of it.
        bins = live.Bins.at(BIN_DIR)
        self.assertEqual(live.policy_trigger(bins, "h2o"), 1.1)
        self.assertEqual(live.policy_trigger(bins, "kvzip{select=layer,trigger=1}"), 1.0)
        with self.assertRaises(live.LiveError) as e:
            live.policy_trigger(bins, "nosuchpolicy")
        self.assertIn("nosuchpolicy", str(e.exception))

    def test_a_live_run_records_compacts_refuses_and_resumes(self):
        with tempfile.TemporaryDirectory() as d:
            self.eval_py(d)
            run = os.path.join(d, "live")
            recs = {r["config"]: r for r in read_jsonl(os.path.join(run, "results.jsonl"))}
            self.assertEqual(sorted(recs), sorted(CONFIGS))
            for r in recs.values():
                self.assertEqual(r["mode"], "live")
                self.assertEqual(r["task"], "recall-000")
                self.assertEqual(r["family"], "recall")
                self.assertIsInstance(r["context_tokens"], int)
            ref, win, bad, quant = (recs[c] for c in CONFIGS)
            # The daemon's refusal, as an error with its message; nothing ran.
            self.assertTrue(bad["error"].startswith("polykvctl qos set: INVALID_ARGUMENT: "
                                                    "policy 'nosuchpolicy'"), bad["error"])
            self.assertNotIn("output", bad)
            for r in (ref, win, quant):
                self.assertNotIn("error", r, r.get("error"))
                for k in ("output", "output_tokens", "token_agreement", "prefix_agreement",
                          "bytes_peak", "bytes_full_f16", "bytes_fraction", "question_tokens",
                          "decode_tokens_per_s", "prefill_tokens_per_s", "stop", "eval"):
                    self.assertIn(k, r)
                self.assertTrue(r["output"].startswith(r["answer_prefix"]))
            self.assertEqual(ref["token_agreement"], 1.0)
            self.assertEqual(ref["compactions"], 0)
            # Both teacher-forced on the reference's answer (its stop too):
            # the reference's own KL is the rounding of a forced chunk
            # against decode steps, far below a changed cache's.
            forced = len(ref["output_tokens"]) + (ref["stop"] == "eos")
            for r in (ref, win):
                self.assertNotIn("forced_error", r, r.get("forced_error"))
                self.assertEqual(r["forced_positions"], forced)
                self.assertGreaterEqual(r["kl_mean"], 0.0)
            self.assertLess(ref["kl_mean"], 0.05)
            self.assertGreaterEqual(ref["top1_agreement"], 0.8)
            self.assertTrue(os.path.exists(os.path.join(run, ref["reference_logprobs"])))
            self.assertIsNone(ref["budget_tokens"])
            # window@0.5: half the context as its QoS budget, and compacted.
            self.assertEqual(win["budget_tokens"], int(0.5 * win["context_tokens"] + 0.5))
            self.assertGreaterEqual(win["compactions"], 1)
            self.assertLess(win["bytes_final"], ref["bytes_final"])
            self.assertLess(win["cached_tokens"], ref["cached_tokens"])
            self.assertEqual(win["bytes_full_f16"], ref["bytes_peak"])
            # K4V2/T32: the worker got 32-token pages and kept its f16 window
            # (live_record checks both against the worker's turn JSON).
            self.assertEqual((quant["block_tokens"], quant["recent_f16_tokens"]), (32, 128))
            self.assertEqual((ref["block_tokens"], ref["recent_f16_tokens"]), (16, 0))
            self.assertEqual(quant["cache"], "pool-int4-int2")
            self.assertLess(quant["bytes_peak"], ref["bytes_peak"])
            # The rest of the pipeline ran on the live records.
            for f in ("scored.jsonl", "report.md", "meta.json", "polykvd.log",
                      "polykvd_metrics.txt"):
                self.assertTrue(os.path.exists(os.path.join(run, f)), f)
            meta = json.loads(read(os.path.join(run, "meta.json")))
            self.assertEqual(meta["mode"], "live")
            self.assertIn("stopped", read(os.path.join(run, "polykvd.log")))

            # --resume: every pair is recorded, so nothing runs again.
            before = read(os.path.join(run, "results.jsonl"))
            p = self.eval_py(d, "--resume")
            self.assertIn("4 (task, config) pairs already in", p.stderr)
            self.assertNotIn("worker runs", p.stderr)
            self.assertEqual(read(os.path.join(run, "results.jsonl")), before)

    def test_answers_without_teacher_forcing_get_only_their_forced_pass(self):
        with tempfile.TemporaryDirectory() as d:
            # A screen and a config, answered without teacher forcing.
            self.eval_py(d, "--no-teacher-force", configs=["full@1/f16", "window@0.5/f16"])
            run = os.path.join(d, "live")
            results = os.path.join(run, "results.jsonl")
            screened = {r["config"]: r for r in read_jsonl(results)}
            for r in screened.values():
                self.assertNotIn("reference_logprobs", r)
                self.assertNotIn("kl_mean", r)
            answers = {c: os.path.join(run, "live", r["agent"] + ".jsonl")
                       for c, r in screened.items()}
            answered = {c: read(a) for c, a in answers.items()}
            # Resumed with teacher forcing: nothing is answered again, both
            # are forced, the config against the reference's forced pass.
            p = self.eval_py(d, "--resume", configs=["full@1/f16", "window@0.5/f16"])
            self.assertIn("2 answered without teacher forcing get their forced pass", p.stderr)
            self.assertIn("2 worker runs", p.stderr)
            recs = {r["config"]: r for r in read_jsonl(results)}
            self.assertEqual(sorted(recs), ["full@1/f16", "window@0.5/f16"])
            self.assertEqual(len(read_jsonl(results)), 2)
            ref, win = recs["full@1/f16"], recs["window@0.5/f16"]
            for c in recs:
                self.assertEqual(read(answers[c]), answered[c])
                self.assertEqual(recs[c]["output_tokens"], screened[c]["output_tokens"])
                self.assertGreater(recs[c]["worker_seconds"], screened[c]["worker_seconds"])
                self.assertNotIn("forced_error", recs[c], recs[c].get("forced_error"))
            self.assertTrue(os.path.exists(os.path.join(run, ref["reference_logprobs"])))
            self.assertLess(ref["kl_mean"], 0.05)
            self.assertGreaterEqual(win["kl_mean"], 0.0)
            self.assertEqual(win["forced_positions"], ref["forced_positions"])
            self.assertEqual(win["budget_tokens"], screened["window@0.5/f16"]["budget_tokens"])


if __name__ == "__main__":
    unittest.main()
