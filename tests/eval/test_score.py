"""Tests of the answer scorer (bench/eval/score.py). Offline, stdlib only, no data.

    python3 -m unittest discover -s tests/eval -v
"""

import contextlib
import io
import json
import os
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench", "eval"))

import score  # noqa: E402

# Short limits keep the runaway cases fast.
FAST = {"timeout_s": 3.0, "cpu_s": 1}

HE = {
    "family": "humaneval", "scorer": "humaneval", "answers": [], "task_id": "Inline/0",
    "entry_point": "running_max",
    "prompt": ("from typing import List\n\n\ndef running_max(xs: List[int]) -> List[int]:\n"
               '    """Running maximum.\n    >>> running_max([1, 3, 2])\n    [1, 3, 3]\n    """\n'),
    "test": ("def check(candidate):\n    assert candidate([]) == []\n"
             "    assert candidate([1, 3, 2]) == [1, 3, 3]\n    assert candidate([5, 1]) == [5, 5]\n"),
}
BODY = ("    out, m = [], None\n    for x in xs:\n        m = x if m is None else max(m, x)\n"
        "        out.append(m)\n    return out\n")


def he(output):
    return score.score(HE, output, **FAST)


class TextScorerTest(unittest.TestCase):
    def test_normalize(self):
        self.assertEqual(score.normalize('  "ORD-4821". '), "ord-4821")
        self.assertEqual(score.normalize("`db-stg-7.internal`"), "db-stg-7.internal")
        self.assertEqual(score.normalize("a \n  b"), "a b")

    def test_contains(self):
        ev = {"scorer": "contains", "answers": ["ORD-48213"]}
        self.assertTrue(score.score(ev, "The order number is ord-48213.")["success"])
        self.assertTrue(score.score(ev, "`ORD-48213`")["success"])
        self.assertFalse(score.score(ev, "ORD-48231")["success"])
        self.assertFalse(score.score(ev, "")["success"])
        sig = {"scorer": "contains", "answers": ["def apply_discount(cart, code, rate=0.1)"]}
        self.assertTrue(score.score(sig, "def  apply_discount(cart, code,  rate=0.1):")["success"])
        self.assertFalse(score.score(sig, "def apply_discount(code, cart, rate=0.1):")["success"])

    def test_exact(self):
        ev = {"scorer": "exact", "answers": ["Priya Shah"]}
        self.assertTrue(score.score(ev, ' "priya  shah". ')["success"])
        self.assertFalse(score.score(ev, "It is Priya Shah.")["success"])

    def test_no_answers_or_unknown_scorer_fail(self):
        self.assertFalse(score.score({"scorer": "contains", "answers": []}, "x")["success"])
        self.assertFalse(score.score({"scorer": "nope"}, "x")["success"])


class SingleCallTest(unittest.TestCase):
    EV = {"scorer": "call", "function": "apply_discount", "args": ["c", "'X'", "0.1"],
          "params": ["cart", "code", "rate"]}

    def ok(self, out):
        return score.score(self.EV, out)["success"]

    def test_positional_keyword_and_fenced_forms(self):
        self.assertTrue(self.ok("apply_discount(c, 'X', 0.1)"))
        self.assertTrue(self.ok('apply_discount(cart=c, code="X", rate=0.10)'))
        self.assertTrue(self.ok("apply_discount(c, code='X', rate=0.1)"))
        self.assertTrue(self.ok("```python\nresult = apply_discount(c, 'X', 0.1)\n```"))
        self.assertTrue(self.ok("Sure (here it is): apply_discount(c, 'X', 0.1)."))

    def test_wrong_order_value_or_function(self):
        self.assertFalse(self.ok("apply_discount(rate=0.1, cart=c, code='X')"))
        self.assertFalse(self.ok("apply_discount('X', c, 0.1)"))
        self.assertFalse(self.ok("apply_discount(c, 'X', '0.1')"))
        self.assertFalse(self.ok("apply_discount(c, 'Y', 0.1)"))
        self.assertFalse(self.ok("apply_discount(c, 'X')"))
        self.assertFalse(self.ok("apply_discounts(c, 'X', 0.1)"))
        self.assertFalse(self.ok("def apply_discount(cart, code, rate):"))
        self.assertFalse(self.ok("I cannot do that."))

    def test_javascript_literals(self):
        ev = {"scorer": "call", "function": "syncLedger", "args": ["true", "'EUR'", "25"],
              "params": ["dry_run", "currency", "limit"]}
        self.assertTrue(score.score(ev, "syncLedger(true, 'EUR', 25);")["success"])
        self.assertFalse(score.score(ev, "syncLedger(false, 'EUR', 25);")["success"])


class CallListTest(unittest.TestCase):
    EV = {"scorer": "call",
          "calls": [{"function": "cd", "kwargs": {"folder": "temp"}},
                    {"function": "tail", "kwargs": {"file_name": "log.txt", "lines": 10}}],
          "params": {"cd": ["folder"], "tail": ["file_name", "lines"]},
          "defaults": {"cd": {}, "tail": {"lines": 10}}}

    def ok(self, out):
        return score.score(self.EV, out)["success"]

    def test_matches(self):
        self.assertTrue(self.ok("[cd(folder='temp'), tail(file_name='log.txt', lines=10)]"))
        self.assertTrue(self.ok('[cd("temp"), tail("log.txt", 10.0)]'))
        self.assertTrue(self.ok("[cd(folder='temp'), tail(file_name='log.txt')]"))  # default
        self.assertTrue(self.ok("[cd(folder='temp'), tail(file_name='log.txt')]\n[ls()]"))

    def test_mismatches(self):
        self.assertFalse(self.ok("[tail(file_name='log.txt'), cd(folder='temp')]"))
        self.assertFalse(self.ok("[cd(folder='temp')]"))
        self.assertFalse(self.ok("[cd(folder='tmp'), tail(file_name='log.txt')]"))
        self.assertFalse(self.ok("[cd(folder='temp'), tail(file_name='log.txt', lines=20)]"))
        self.assertFalse(self.ok("[cd(folder='temp'), tail(file_name='log.txt', n=3)]"))
        self.assertFalse(self.ok("[cd(folder='temp'), tail('log.txt', 10, 3)]"))

    def test_value_normalization(self):
        self.assertTrue(score.values_match(["@a", "@b"], ["@a", "@b"]))
        self.assertTrue(score.values_match(20, "20"))
        self.assertTrue(score.values_match(True, "True"))
        self.assertTrue(score.values_match(None, "None"))
        self.assertFalse(score.values_match(True, 1))
        self.assertFalse(score.values_match({"a": 1}, {"a": 2}))


class HumanEvalTest(unittest.TestCase):
    def test_completion_appended_to_prompt_passes(self):
        self.assertEqual(he(BODY), {"success": True, "detail": "passed"})

    def test_full_function_in_fence_passes(self):
        # The prompt's imports (List) are kept when the output repeats the def.
        out = "```python\ndef running_max(xs: List[int]) -> List[int]:\n" + BODY + "```\nDone."
        self.assertTrue(he(out)["success"])

    def test_flush_left_body_and_trailing_prose(self):
        body = "\n".join(l[4:] for l in BODY.split("\n"))
        self.assertTrue(he(body + "\n\n# That is all.\nprint('x')")["success"])

    def test_wrong_answer_fails(self):
        r = he("    return xs\n")
        self.assertFalse(r["success"])
        self.assertIn("AssertionError", r["detail"])

    def test_syntax_error_fails(self):
        self.assertFalse(he("    return [\n")["success"])

    def test_infinite_loop_is_stopped(self):
        r = he("    while True:\n        pass\n")
        self.assertFalse(r["success"])
        self.assertRegex(r["detail"], "cpu limit|timeout")

    def test_sleeping_candidate_times_out(self):
        r = score.score(HE, "    import time\n    time.sleep(60)\n", timeout_s=1.0, cpu_s=1)
        self.assertEqual(r, {"success": False, "detail": "timeout after 1 s"})

    def test_write_outside_temp_dir_is_refused(self):
        with tempfile.TemporaryDirectory() as tmp:
            target = os.path.join(tmp, "escaped.txt")
            r = he(f"    open({target!r}, 'w').write('x')\n" + BODY)
            self.assertFalse(r["success"])
            self.assertIn("sandbox", r["detail"])
            self.assertFalse(os.path.exists(target))
            r = he(f"    import os\n    os.remove({tmp!r})\n" + BODY)
            self.assertFalse(r["success"])
            self.assertTrue(os.path.isdir(tmp))

    def test_write_inside_temp_dir_is_allowed(self):
        self.assertTrue(he("    open('scratch.txt', 'w').write('x')\n" + BODY)["success"])

    def test_processes_and_early_exit_are_refused(self):
        self.assertFalse(he("    import os\n    os.system('true')\n" + BODY)["success"])
        self.assertFalse(he("    import subprocess\n    subprocess.run(['true'])\n" + BODY)["success"])
        # Exiting 0 before check() ran is not a pass.
        r = he("    import sys\n    sys.exit(0)\n")
        self.assertFalse(r["success"])
        self.assertFalse(he("    import os\n    os._exit(0)\n")["success"])

    def test_memory_limit(self):
        self.assertFalse(he("    x = bytearray(3 << 30)\n" + BODY)["success"])


class CliTest(unittest.TestCase):
    def test_scores_records_in_order(self):
        records = [
            {"id": "r1", "eval": {"family": "recall", "scorer": "contains", "answers": ["ORD-1"]},
             "output": "ORD-1"},
            {"id": "r2", "eval": {"family": "recall", "scorer": "contains", "answers": ["ORD-1"]},
             "output": "ORD-2"},
            {"id": "r3", "output": "no eval here"},
            {"id": "r4", "eval": HE, "output": BODY},
        ]
        with tempfile.TemporaryDirectory() as tmp:
            src, dst = os.path.join(tmp, "in.jsonl"), os.path.join(tmp, "out.jsonl")
            with open(src, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in records)
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                self.assertEqual(score.main([src, "-o", dst]), 0)
            with open(dst) as f:
                out = [json.loads(l) for l in f]
        self.assertEqual([r["id"] for r in out], ["r1", "r2", "r3", "r4"])
        self.assertEqual([r["success"] for r in out], [True, False, None, True])
        self.assertTrue(all("score_detail" in r for r in out))
        self.assertEqual(out[0]["output"], "ORD-1")
        self.assertIn("recall: 1/2", err.getvalue())


if __name__ == "__main__":
    unittest.main()
