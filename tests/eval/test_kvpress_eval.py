"""bench/anchor/kvpress_eval.py without torch or a model: the split of a task
into the compressed context and the uncompressed question, the bytes it
counts, config names and argument errors. The model side runs by hand
(bench/eval/README.md, "The kvpress anchor"); CI has no torch.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench", "anchor"))

import kvpress_eval as kv  # noqa: E402


def chatml(msgs, generation_prompt):
    """A ChatML renderer like Qwen's template, for the split's contract."""
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in msgs)
    return text + ("<|im_start|>assistant\n" if generation_prompt else "")


def words(text):
    """A tokenizer whose tokens are the text's whitespace-separated pieces."""
    return text.split()


class SplitPromptTest(unittest.TestCase):
    MSGS = [{"role": "system", "content": "be brief"},
            {"role": "tool", "content": "ext 3144"},
            {"role": "user", "content": "which ext?"}]

    def test_the_question_and_prefix_follow_the_context(self):
        ctx, q = kv.split_prompt(chatml, words, self.MSGS, "The ext is")
        self.assertEqual(ctx, words(chatml(self.MSGS[:2], False)))
        self.assertEqual(ctx + q, words(chatml(self.MSGS, True)) + ["The", "ext", "is"])
        self.assertEqual(q[-3:], ["The", "ext", "is"])

    def test_no_prefix_adds_nothing(self):
        ctx, q = kv.split_prompt(chatml, words, self.MSGS, "")
        self.assertEqual(ctx + q, words(chatml(self.MSGS, True)))

    def test_a_turn_not_after_a_user_message_is_refused(self):
        with self.assertRaisesRegex(ValueError, "user message"):
            kv.split_prompt(chatml, words, self.MSGS[:2], "")

    def test_a_template_that_rewrites_the_context_is_refused(self):
        def rewrites(msgs, gen):  # marks the last message, as some templates do
            return chatml(msgs[:-1], False) + f"<last>{msgs[-1]['content']}" + ("!" if gen else "")
        with self.assertRaisesRegex(ValueError, "renders the context differently"):
            kv.split_prompt(rewrites, words, self.MSGS, "")

    def test_tokens_that_merge_across_the_boundary_are_refused(self):
        def glue(text):  # a tokenizer that merges "tool\n" with what follows
            return [text[i:i + 7] for i in range(0, len(text), 7)]
        with self.assertRaisesRegex(ValueError, "not a prefix"):
            kv.split_prompt(chatml, glue, self.MSGS, "")


class MessagesTest(unittest.TestCase):
    def write(self, d, lines):
        p = os.path.join(d, "t.jsonl")
        with open(p, "w") as f:
            f.write("\n".join(json.dumps(o) for o in lines) + "\n")
        return p

    def test_messages_stop_before_the_turn_and_keep_the_tools(self):
        with tempfile.TemporaryDirectory() as d:
            p = self.write(d, [
                {"tools": [{"name": "f"}]},
                {"role": "system", "content": "s", "intent": "x"},
                {"role": "user", "content": "q"},
                {"role": "assistant", "id": "t1", "answer_prefix": "A:", "eval": {"family": "recall"}},
            ])
            task = kv.live.read_task(p)
            tools, msgs = kv.messages_of(task)
        self.assertEqual(tools, [{"name": "f"}])
        self.assertEqual(msgs, [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}])
        self.assertEqual(task.answer_prefix, "A:")

    def test_a_task_that_generates_earlier_turns_is_refused(self):
        with tempfile.TemporaryDirectory() as d:
            p = self.write(d, [
                {"role": "user", "content": "a"},
                {"role": "assistant", "id": "g1"},
                {"role": "user", "content": "b"},
                {"role": "assistant", "id": "g2"},
            ])
            with self.assertRaisesRegex(ValueError, "earlier turns"):
                kv.messages_of(kv.live.read_task(p))


class MeasuresTest(unittest.TestCase):
    def test_bytes_count_the_kept_context_and_everything_after_it(self):
        self.assertAlmostEqual(kv.bytes_fraction(0.25, 1000, 50, 50), (250 + 100) / 1100)
        self.assertEqual(kv.bytes_fraction(1.0, 1000, 50, 50), 1.0)
        self.assertEqual(kv.bytes_fraction(0.5, 0, 0, 0), 1.0)

    def test_the_stop_token_is_not_part_of_the_answer(self):
        self.assertEqual(kv.without_stop([5, 6, 9], {9}), [5, 6])
        self.assertEqual(kv.without_stop([5, 6], {9}), [5, 6])
        self.assertEqual(kv.without_stop([], {9}), [])

    def test_config_names_parse_as_report_py_parses_them(self):
        sys.path.insert(0, os.path.join(ROOT, "bench", "eval"))
        import report
        name = kv.config_name("adakv-expected", 0.25)
        self.assertEqual(name, "kvpress-adakv-expected@0.25/f16")
        self.assertEqual(report.parse_config(name), ("kvpress-adakv-expected", 0.25, "f16"))


class ArgumentsTest(unittest.TestCase):
    def test_bad_keep_and_press_are_errors(self):
        for argv in (["--keep", "0"], ["--keep", "1.5"], ["--presses", "h2o"]):
            with self.subTest(argv=argv), self.assertRaises(SystemExit) as e:
                kv.main(["--tasks", __file__, "--out", tempfile.gettempdir()] + argv)
            self.assertEqual(e.exception.code, 2)

    def test_an_existing_run_needs_resume(self):
        with tempfile.TemporaryDirectory() as d:
            open(os.path.join(d, "results.jsonl"), "w").close()
            model = os.path.join(d, "m.gguf")
            open(model, "w").close()
            with self.assertRaises(SystemExit) as e:
                kv.main(["--tasks", __file__, "--out", d, "--model", model])
            self.assertEqual(e.exception.code, 2)


if __name__ == "__main__":
    unittest.main()
