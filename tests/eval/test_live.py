"""bench/eval/live.py without a daemon or a model: config parsing, budgets,
agent names, task reading, the compaction check and the records built from
worker output.

The whole path (polykvd, workers) runs in tests/eval/live_e2e.py (ctest
eval_live_test).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench", "eval"))

import eval as driver  # noqa: E402
import live  # noqa: E402
import solved  # noqa: E402


def write_task(d: str, name: str, lines: list[dict]) -> str:
    path = os.path.join(d, name)
    with open(path, "w") as f:
        for o in lines:
            f.write(json.dumps(o) + "\n")
    return path


TASK_LINES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "The tag is v1.2."},
    {"role": "assistant", "content": "Noted."},
    {"role": "user", "content": "What is the tag?"},
    {"role": "assistant", "id": "recall-007", "max_new_tokens": 8, "answer_prefix": "The tag is",
     "eval": {"family": "recall", "scorer": "contains", "answers": ["v1.2"]}},
]


def turn(prompt, completion, tokens, epoch=0, cache="pool-f16-f16", peak=1000, final=600,
         text=" v1.2.", stop="eos", block_tokens=16, recent=0):
    return {"agent": "a", "id": "recall-007", "turn": 4, "text": text, "tokens": tokens,
            "prompt_tokens": prompt, "completion_tokens": completion,
            "cached_tokens": prompt + completion - 1, "decode_tokens_per_s": 20.0,
            "prefill_tokens_per_s": 150.0, "stop": stop, "cache": cache, "kv_bytes": final,
            "kv_bytes_peak": peak, "epoch": epoch, "block_tokens": block_tokens,
            "sync_every_steps": 8, "sync_every_tokens": 64,  # as polykv-worker prints them
            **({"recent_f16_tokens": recent} if recent else {})}


class SplitListTest(unittest.TestCase):
    def test_commas_inside_braces_stay_with_their_policy(self):
        got = driver.split_list(["full@1/f16,h2o{cold.format=int4,cold.fraction=0.5}@0.25/f16",
                                 "window@0.1/f16"])
        self.assertEqual(got, ["full@1/f16", "h2o{cold.format=int4,cold.fraction=0.5}@0.25/f16",
                               "window@0.1/f16"])
        self.assertEqual(driver.split_list(["a,,b"]), ["a", "b"])
        cfg = live.parse_config(got[1])
        self.assertEqual(cfg.policy, "h2o{cold.format=int4,cold.fraction=0.5}")


class ConfigTest(unittest.TestCase):
    def test_canonical_text_and_formats(self):
        c = live.parse_config("h2o@0.25/K8V4")
        self.assertEqual((c.text, c.policy, c.budget, c.k_format, c.v_format, c.f16_tail),
                         ("h2o@0.25/K8V4", "h2o", 0.25, "int8", "int4", 0))
        # "full" ignores its budget; %g drops trailing zeros
        self.assertEqual(live.parse_config("full@0.5/f16").text, "full@1/f16")
        c = live.parse_config("sinks+structural+intent@0.10/K2V2")
        self.assertEqual((c.text, c.k_format, c.v_format, c.f16_tail),
                         ("sinks+structural+intent@0.1/K2V2", "int2", "int2", 128))
        self.assertEqual(live.parse_config("window@1/f32").k_format, "f32")
        # pages of T tokens; T16 is the default and unnamed
        c = live.parse_config("full@1/K4V2/T64")
        self.assertEqual((c.text, c.formats, c.k_format, c.v_format, c.block_tokens),
                         ("full@1/K4V2/T64", "K4V2", "int4", "int2", 64))
        self.assertEqual(live.parse_config("h2o@0.5/K8V4/T16").text, "h2o@0.5/K8V4")
        self.assertEqual(live.parse_config("h2o@0.5/K8V4").block_tokens, 16)
        # R<n>: the f16 recent window; int2 formats default to 128, others to 0
        c = live.parse_config("full@1/K4V4/R128/T64")
        self.assertEqual((c.text, c.f16_tail, c.block_tokens), ("full@1/K4V4/T64/R128", 128, 64))
        self.assertEqual(live.parse_config("full@1/K4V2/R128").text, "full@1/K4V2")
        c = live.parse_config("full@1/K2V2/R0")
        self.assertEqual((c.text, c.f16_tail), ("full@1/K2V2/R0", 0))
        self.assertEqual(live.parse_config("full@1/f16/R0").text, "full@1/f16")
        # F<n>: a fractional budget with a floor of n tokens (live only)
        c = live.parse_config("kvzip@0.75/K4V4/F512/T64")
        self.assertEqual((c.text, c.fractional, c.budget_floor, c.budget, c.block_tokens),
                         ("kvzip@0.75/K4V4/T64/F512", True, 512, 0.75, 64))
        self.assertFalse(live.parse_config("kvzip@0.75/K4V4").fractional)
        self.assertEqual(live.parse_config("h2o@0.5/f16/F0").budget_floor, 0)
        # P<n>: the worker's prefill chunk (live only); the default is unnamed
        c = live.parse_config("kvzip@0.25/K4V4/P32/T64")
        self.assertEqual((c.text, c.prefill_chunk), ("kvzip@0.25/K4V4/T64/P32", 32))
        self.assertEqual(live.parse_config("kvzip@0.25/K4V4/P128").text, "kvzip@0.25/K4V4")
        self.assertEqual(live.parse_config("kvzip@0.25/K4V4").prefill_chunk, live.PREFILL_CHUNK)
        for bad in ("h2o", "@0.5/f16", "h2o@0/f16", "h2o@1.5/f16", "h2o@x/f16", "h2o@0.5/K3V4",
                    "h2o@0.5/bf16", "full@1/K4V4/T48", "full@1/K4V4/T512", "full@1/K4V4/T",
                    "full@1/T64", "full@1/K4V4/T64/T64", "full@1/f16/R128", "full@1/K4V4/R-1",
                    "full@1/K4V4/R128/R64", "full@1/K4V4/Rx", "h2o@0.5/f16/F",
                    "h2o@0.5/f16/F-1", "h2o@0.5/f16/F8/F8", "full@1/K4V4/F0",
                    "h2o@0.5/f16/P0", "h2o@0.5/f16/P", "h2o@0.5/f16/P8/P8", "h2o@0.5/f16/P9999"):
            with self.assertRaises(ValueError, msg=bad):
                live.parse_config(bad)

    def test_budget_rounds_like_llround(self):
        self.assertEqual(live.budget_tokens(0.5, 1025), 513)   # 512.5 -> 513 (not to even)
        self.assertEqual(live.budget_tokens(0.25, 1027), 257)
        self.assertEqual(live.budget_tokens(0.001, 10), 1)

    def test_agent_names_are_legal_and_unique(self):
        taken = set()
        a = live.agent_name("recall-000", "sinks+structural+intent@0.1/K2V2", taken)
        self.assertEqual(a, "recall-000.sinks-structural-intent_0.1_K2V2")
        self.assertRegex(a, r"^[A-Za-z0-9_.:-]+$")
        self.assertEqual(live.agent_name("recall-000", "sinks+structural+intent@0.1/K2V2", taken),
                         a + ".2")
        long = live.agent_name("t" * 300, "h2o@0.5/f16", taken)
        self.assertLessEqual(len(long), live.AGENT_MAX_LEN)
        self.assertNotEqual(live.agent_name("t" * 300, "h2o@0.5/f16", taken), long)

    def test_agreement_as_runner_cc(self):
        self.assertEqual(live.agreement([1, 2, 3], [1, 2, 3]), (1.0, 1.0))
        self.assertEqual(live.agreement([], []), (1.0, 1.0))
        p, t = live.agreement([1, 2, 3], [1, 2])
        self.assertAlmostEqual(p, 2 / 3)
        self.assertAlmostEqual(t, 2 / 3)
        p, t = live.agreement([1, 2], [9, 2, 3, 4])  # extra tokens count against
        self.assertEqual((p, t), (0.0, 0.25))


class TaskTest(unittest.TestCase):
    def test_read_task_and_context(self):
        with tempfile.TemporaryDirectory() as d:
            t = live.read_task(write_task(d, "x.jsonl", TASK_LINES))
            self.assertEqual((t.id, t.family, t.generation_line, t.question_line, t.answer_prefix),
                             ("recall-007", "recall", 5, 4, "The tag is"))
            count = [{"model": "m", "num_layers": 30, "num_kv_heads": 3, "head_dim": 64,
                      "context_length": 8192}] + [
                {"line": i + 1, "position": p} for i, p in enumerate([0, 10, 25, 31])] + [
                {"line": 5, "position": 40, "generate": True}]
            ctx, geo = live.context_from_count(t, count)
            self.assertEqual(ctx, 31)
            self.assertEqual(live.bytes_per_token_f16(geo), 23040)
            with self.assertRaises(live.LiveError):
                live.context_from_count(t, count[1:])  # no geometry
            # no question: the context ends at the generation line
            t2 = live.read_task(write_task(d, "y.jsonl", TASK_LINES[:3] + TASK_LINES[4:]))
            self.assertIsNone(t2.question_line)
            self.assertEqual(t2.generation_line, 4)
            # a generated turn inside the context cannot be counted without a run
            t3 = live.read_task(write_task(d, "z.jsonl", TASK_LINES[:2] + [
                {"role": "assistant", "max_new_tokens": 4}] + TASK_LINES[3:]))
            self.assertEqual(t3.generated_in_context, [3])
            with self.assertRaisesRegex(live.LiveError, "generated turns"):
                live.context_from_count(t3, count)
            t4 = live.read_task(write_task(d, "plain.jsonl", TASK_LINES[:4] + [
                {"role": "assistant"}]))
            self.assertEqual((t4.id, t4.family, t4.eval), ("plain", "script", None))

    def test_page_formats_are_the_kernels_table(self):
        # One list of formats in Python (live.PAGE_FORMATS; report and eval
        # use it), checked against kernels/page_format.cc's, in wire order.
        with open(os.path.join(ROOT, "kernels", "page_format.cc")) as f:
            src = f.read()
        table = src[src.index("std::string_view FormatShortName("):]
        table = table[:table.index("\n}\n")]
        self.assertEqual(live.PAGE_FORMATS, tuple(re.findall(r'return "(\w+)";', table)[:-1]))

    def test_compaction_expected_follows_the_sync_cadence(self):
        # 1050 prompt tokens = 8 chunks of 128 + 26; a chunk is past the
        # 64 tokens of a sync, so the worker syncs before every prefill step
        self.assertTrue(live.compaction_expected(513, [turn(1050, 24, [])], trigger=1.1))
        self.assertTrue(live.compaction_expected(200, [turn(300, 1, [])], trigger=1.1))  # the Sync at 256
        self.assertFalse(live.compaction_expected(2000, [turn(1050, 24, [])], trigger=1.1))
        # trigger 1100: the Syncs see 0, 128, ..., 1024, 1050, 1058 and 1066 tokens
        self.assertFalse(live.compaction_expected(1000, [turn(1050, 24, [])], trigger=1.1))
        # at the shipped default's trigger 1, past 1001: the Sync at 1050
        self.assertTrue(live.compaction_expected(1000, [turn(1050, 24, [])], trigger=1.0))
        # trigger 1045: only the Sync after the last prefill chunk sees past it
        self.assertTrue(live.compaction_expected(950, [turn(1050, 24, [])], trigger=1.1))
        # earlier turns are already committed at the last turn's first Sync
        self.assertTrue(live.compaction_expected(100, [turn(200, 5, []), turn(10, 2, [])], trigger=1.1))
        self.assertFalse(live.compaction_expected(100, [], trigger=1.1))

    def test_compaction_expected_with_a_fractional_budget(self):
        # 3/4 of what is held, nothing dropped: past 110% of it at the Sync
        # after the first chunk (128 > 96 + 9), whatever the context's length
        self.assertTrue(live.compaction_expected(0, [turn(300, 1, [])], fraction=0.75,
                                                 trigger=1.1))
        # the floor holds it off: 2000 + 200 is never reached in 1050 + 24
        self.assertFalse(live.compaction_expected(2000, [turn(1050, 24, [])], fraction=0.75,
                                                  trigger=1.1))
        # 0.95 x 110% > 1: a session that drops nothing never outgrows its trigger
        self.assertFalse(live.compaction_expected(0, [turn(1050, 24, [])], fraction=0.95,
                                                  trigger=1.1))


class RecordTest(unittest.TestCase):
    def setUp(self):
        self.d = tempfile.mkdtemp()
        self.task = live.read_task(write_task(self.d, "x.jsonl", TASK_LINES))

    def test_reference_and_compressed_records(self):
        ref_cfg = live.parse_config("full@1/f16")
        ref = live.live_record(self.task, ref_cfg, 1025, 23040, None, "a0",
                               [turn(1050, 8, [1, 2, 3, 4, 5, 6, 7], peak=2000, final=2000)],
                               None, None, 3.0)
        self.assertNotIn("error", ref)
        self.assertEqual(ref["mode"], "live")
        self.assertEqual(ref["output"], "The tag is v1.2.")
        self.assertEqual((ref["token_agreement"], ref["bytes_fraction"]), (1.0, 1.0))
        self.assertEqual((ref["question_tokens"], ref["bytes_full_f16"]), (25, 2000))
        self.assertIsNone(ref["kept_slots_mean"])
        cfg = live.parse_config("window@0.5/f16")
        rec = live.live_record(self.task, cfg, 1025, 23040, 513, "a1",
                               [turn(1050, 8, [1, 2, 9], epoch=2, peak=1500, final=700)],
                               {"summary": True, "kv_bytes": 700, "kv_bytes_peak": 1500,
                                "prefill_tokens_per_s": 140.0}, ref, 2.0)
        self.assertNotIn("error", rec)
        self.assertEqual(rec["compactions"], 2)
        self.assertEqual((rec["bytes_peak"], rec["bytes_final"], rec["bytes_full_f16"]),
                         (1500, 700, 2000))
        self.assertEqual(rec["bytes_fraction"], 0.75)
        self.assertEqual(rec["ref_tokens_len"], 7)
        self.assertAlmostEqual(rec["token_agreement"], 2 / 7, places=5)
        for k in ("task", "family", "file", "config", "policy", "budget", "formats",
                  "k_format", "v_format", "context_tokens", "bytes_per_token_f16", "eval",
                  "output_tokens", "stop", "prefix_agreement", "decode_tokens_per_s",
                  "prefill_tokens_per_s", "bytes_mean", "compaction_ms"):
            self.assertIn(k, rec)

    def test_refusals_are_errors_not_other_configs(self):
        cfg = live.parse_config("h2o@0.25/K8V4")
        # the daemon gave other formats than asked
        rec = live.live_record(self.task, cfg, 1025, 23040, 256, "a",
                               [turn(1050, 8, [1], epoch=1)], None, {"output_tokens": [1]}, 1.0)
        self.assertIn("not the pool-int8-int4", rec["error"])
        # ... or other pages than asked
        rec = live.live_record(self.task, live.parse_config("full@1/f16/T64"), 1025, 23040, None,
                               "a", [turn(1050, 8, [1])], None, {"output_tokens": [1]}, 1.0)
        self.assertIn("pages of 16 tokens, not the 64", rec["error"])
        # a budget that had to compact, but the table never changed
        cfg = live.parse_config("h2o@0.25/f16")
        cfg.trigger = 1.1  # as polykvd --describe-policy h2o says
        rec = live.live_record(self.task, cfg, 1025, 23040, 256, "a",
                               [turn(1050, 8, [1], epoch=0)], None, {"output_tokens": [1]}, 1.0)
        self.assertIn("never compacted", rec["error"])
        self.assertNotIn("output", rec)
        # K2V2's f16 recent window: live asks the worker for it and checks it got it
        cfg = live.parse_config("full@1/K2V2")
        rec = live.base_record(self.task, cfg, 1025, 23040)
        self.assertEqual(rec["recent_f16_tokens"], 128)
        self.assertIn("f16 recent window", rec["live_notes"][0])
        rec = live.live_record(self.task, cfg, 1025, 23040, None, "a",
                               [turn(1050, 8, [1], cache="pool-int2-int2")], None,
                               {"output_tokens": [1]}, 1.0)
        self.assertIn("kept 0 recent tokens in f16, not the 128", rec["error"])
        rec = live.live_record(self.task, cfg, 1025, 23040, None, "a",
                               [turn(1050, 8, [1], cache="pool-int2-int2", recent=128)], None,
                               {"output_tokens": [1]}, 1.0)
        self.assertNotIn("error", rec)

    def test_tool_errors_keep_the_daemon_message(self):
        msg = live.tool_error("polykvctl qos set",
                              "polykvctl: INVALID_ARGUMENT: policy 'x': unknown policy\n")
        self.assertEqual(msg, "polykvctl qos set: INVALID_ARGUMENT: policy 'x': unknown policy")

    def test_worker_output_parsing(self):
        text = json.dumps(turn(10, 2, [5])) + "\nnoise\n" + json.dumps({"summary": True}) + "\n"
        turns, summary = live.parse_worker_output(text)
        self.assertEqual(len(turns), 1)
        self.assertTrue(summary["summary"])


class DriverFlagsTest(unittest.TestCase):
    def test_live_flags(self):
        args = driver.parse_args(["--live", "--resume", "--bin-dir", "/x", "--no-plots"])
        self.assertTrue(args.live and args.resume and args.no_plots)
        self.assertEqual(args.bin_dir, "/x")
        args = driver.parse_args([])
        self.assertFalse(args.live or args.resume or args.no_plots)
        # --live is the only mode; old commands that name it still parse.
        self.assertTrue(driver.parse_args(["--resume"]).resume)


class ScreenTest(unittest.TestCase):
    """A screen (the reference alone, no teacher forcing), then the configs
    on the tasks it solves (bench/eval/solved.py)."""

    def test_a_record_without_its_forced_pass_needs_one(self):
        ref, other = live.parse_config("full@1/f16"), live.parse_config("window@0.5/f16")
        screened = {"config": ref.text, "agent": "a"}
        self.assertTrue(live.needs_forced_pass(screened, ref, True))
        self.assertFalse(live.needs_forced_pass(screened, ref, False))
        self.assertFalse(live.needs_forced_pass(None, ref, True))
        self.assertFalse(live.needs_forced_pass(dict(screened, error="x"), ref, True))
        self.assertFalse(live.needs_forced_pass(
            dict(screened, reference_logprobs="live/a.tf.logprobs.jsonl"), ref, True))
        # Another config's marker is its forced measures.
        self.assertTrue(live.needs_forced_pass({"config": other.text}, other, True))
        self.assertTrue(live.needs_forced_pass({"config": other.text, "forced_error": "x"},
                                               other, True))
        self.assertFalse(live.needs_forced_pass({"config": other.text, "forced_positions": 9},
                                                other, True))

    def test_write_records_replaces_the_file(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "results.jsonl")
            with open(path, "w") as f:
                f.write('{"task": "a"}\n{"task": "a", "kl_mean": 0.0}\n')
            live.write_records(path, [{"task": "a", "kl_mean": 0.0}])
            with open(path) as f:
                self.assertEqual(f.read(), '{"task": "a", "kl_mean": 0.0}\n')
            self.assertEqual(os.listdir(d), ["results.jsonl"])

    def screen(self, d: str) -> str:
        src = os.path.join(d, "screen")
        os.makedirs(os.path.join(src, "tasks"))
        os.makedirs(os.path.join(src, "live"))
        manifest, recs = [], []
        for tid, out in (("recall-000", "The tag is v1.2."), ("recall-001", "The tag is v9."),
                         ("recall-002", None)):
            name = tid + ".jsonl"
            lines = [dict(x) for x in TASK_LINES]
            lines[-1]["id"] = tid
            write_task(os.path.join(src, "tasks"), name, lines)
            manifest.append({"task_id": tid, "file": name})
            agent = tid + ".full_1_f16"
            for ext in (".jsonl", ".err", ".logprobs.jsonl"):
                with open(os.path.join(src, "live", agent + ext), "w") as f:
                    f.write(tid)
            rec = {"task": tid, "family": "recall", "file": os.path.join(src, "tasks", name),
                   "config": "full@1/f16", "mode": "live", "agent": agent,
                   "eval": lines[-1]["eval"]}
            rec.update({"output": out} if out else {"error": "polykv-worker (exit 1)"})
            recs.append(rec)
        # A config's record: not a reference, not copied.
        recs.append(dict(recs[0], config="window@0.5/f16", agent="x"))
        with open(os.path.join(src, "tasks", "manifest.json"), "w") as f:
            json.dump(manifest, f)
        live.write_records(os.path.join(src, "results.jsonl"), recs)
        return src

    def test_solved_copies_the_solved_tasks_and_their_references(self):
        with tempfile.TemporaryDirectory() as d:
            src, dst = self.screen(d), os.path.join(d, "solved")
            before = sorted(os.listdir(os.path.join(src, "live")))
            self.assertEqual(solved.main([src, dst]), 0)
            self.assertEqual(sorted(os.listdir(os.path.join(dst, "tasks"))),
                             ["manifest.json", "recall-000.jsonl"])
            with open(os.path.join(dst, "tasks", "manifest.json")) as f:
                self.assertEqual([e["task_id"] for e in json.load(f)], ["recall-000"])
            self.assertEqual(sorted(os.listdir(os.path.join(dst, "live"))),
                             ["recall-000.full_1_f16" + e
                              for e in (".err", ".jsonl", ".logprobs.jsonl")])
            with open(os.path.join(dst, "results.jsonl")) as f:
                recs = [json.loads(x) for x in f]
            self.assertEqual([(r["task"], r["config"]) for r in recs],
                             [("recall-000", "full@1/f16")])
            # The record names the copied task file; the screen is unchanged.
            self.assertEqual(recs[0]["file"], os.path.join(dst, "tasks", "recall-000.jsonl"))
            self.assertEqual(sorted(os.listdir(os.path.join(src, "live"))), before)
            with self.assertRaises(SystemExit):
                solved.main([src, dst])  # dst exists

    def test_solved_refuses_a_screen_that_solves_nothing(self):
        with tempfile.TemporaryDirectory() as d:
            src = self.screen(d)
            results = os.path.join(src, "results.jsonl")
            with open(results) as f:
                recs = [json.loads(x) for x in f]
            live.write_records(results, [dict(r, output="no") for r in recs])
            with self.assertRaises(SystemExit) as e:
                solved.main([src, os.path.join(d, "solved")])
            self.assertIn("solves none", str(e.exception))
            self.assertFalse(os.path.exists(os.path.join(d, "solved")))

    def scored_copy(self, src: str, d: str) -> str:
        """src's records as a committed folder keeps them: scored, gzipped,
        no tasks or worker files beside them."""
        out = os.path.join(d, "committed", "scored.jsonl.gz")
        os.makedirs(os.path.dirname(out))
        with open(os.path.join(src, "results.jsonl")) as f, gzip.open(out, "wt") as g:
            for line in f:
                g.write(json.dumps(dict(json.loads(line), success=1.0, score_detail="x")) + "\n")
        return out

    def test_solved_cuts_a_subset_from_committed_records_and_carries_the_others(self):
        with tempfile.TemporaryDirectory() as d:
            src = self.screen(d)
            write_task(os.path.join(src, "tasks"), "recall-003.jsonl",
                       [dict(x) for x in TASK_LINES[:-1]]
                       + [dict(TASK_LINES[-1], id="recall-003")])
            recs = list(live.read_records(os.path.join(src, "results.jsonl"), "").values())
            recs.append(dict(recs[0], task="recall-003", agent="recall-003.full_1_f16",
                             file=os.path.join(src, "tasks", "recall-003.jsonl")))
            live.write_records(os.path.join(src, "results.jsonl"), recs)
            committed = self.scored_copy(src, d)
            only = os.path.join(d, "only.json")
            with open(only, "w") as f:
                json.dump([{"task_id": "recall-003", "file": "recall-003.jsonl"}], f)
            dst = os.path.join(d, "sub")
            self.assertEqual(solved.main([committed, dst, "--tasks", os.path.join(src, "tasks"),
                                          "--only", only, "--records", committed]), 0)
            self.assertEqual(sorted(os.listdir(os.path.join(dst, "tasks"))),
                             ["recall-003.jsonl"])  # the screen's manifest lacks it
            got = list(live.read_records(os.path.join(dst, "results.jsonl"), "").values())
            self.assertEqual([(r["task"], r["config"]) for r in got],
                             [("recall-003", "full@1/f16")])
            self.assertNotIn("success", got[0])  # the resumed run scores it again
            self.assertEqual(got[0]["file"], os.path.join(dst, "tasks", "recall-003.jsonl"))
            self.assertEqual(os.listdir(os.path.join(dst, "live")), [])

            # The other config's record rides along with --records.
            dst2 = os.path.join(d, "sub2")
            self.assertEqual(solved.main([src, dst2, "--records", committed]), 0)
            got = live.read_records(os.path.join(dst2, "results.jsonl"), "")
            self.assertEqual(sorted(got), [("recall-000", "full@1/f16"),
                                           ("recall-000", "window@0.5/f16"),
                                           ("recall-003", "full@1/f16")])

            # SRC's references decided the cut, so another file's do not replace them.
            rerun = os.path.join(d, "rerun.jsonl")
            live.write_records(rerun, [dict(r, output="The tag is v1.2, again.")
                                       for r in live.read_records(
                                           os.path.join(src, "results.jsonl"), "").values()])
            dst3 = os.path.join(d, "sub3")
            self.assertEqual(solved.main([src, dst3, "--records", rerun]), 0)
            got = live.read_records(os.path.join(dst3, "results.jsonl"), "")
            self.assertEqual(got[("recall-000", "full@1/f16")]["output"], "The tag is v1.2.")
            self.assertEqual(got[("recall-000", "window@0.5/f16")]["output"],
                             "The tag is v1.2, again.")

    def test_solved_refuses_a_cut_it_cannot_make_and_writes_nothing(self):
        with tempfile.TemporaryDirectory() as d:
            src, dst = self.screen(d), os.path.join(d, "sub")
            only = os.path.join(d, "only.json")
            with open(only, "w") as f:
                json.dump([{"file": "recall-001.jsonl"}], f)  # answered wrong
            with self.assertRaises(SystemExit) as e:
                solved.main([src, dst, "--only", only])
            self.assertIn("recall-001.jsonl", str(e.exception))
            # Tasks regenerated with another seed ask another question.
            other = os.path.join(d, "other")
            os.makedirs(other)
            write_task(other, "recall-000.jsonl",
                       [dict(x) for x in TASK_LINES[:-1]]
                       + [dict(TASK_LINES[-1], id="recall-000",
                               eval={"family": "recall", "scorer": "contains",
                                     "answers": ["v7"]})])
            with self.assertRaises(SystemExit) as e:
                solved.main([src, dst, "--tasks", other])
            self.assertIn("not the task", str(e.exception))
            with self.assertRaises(SystemExit) as e:
                solved.main([os.path.join(d, "nowhere.jsonl"), dst])
            self.assertFalse(os.path.exists(dst))


if __name__ == "__main__":
    unittest.main()
