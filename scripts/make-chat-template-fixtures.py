#!/usr/bin/env python3
"""Writes tests/fixtures/worker/qwen_chat_template_cases.jsonl: conversations
rendered by the GGUF's own Jinja chat template, with their token ids.

Run by hand, never by the tests (they only read the fixture):

    scripts/fetch-model.sh qwen2.5-coder-0.5b && scripts/fetch-model.sh smollm2-135m
    ~/.cache/polykv/ref-venv/bin/python scripts/make-chat-template-fixtures.py

The venv needs gguf, jinja2 and tokenizers only (not torch or transformers):
  * Rendering replicates transformers' apply_chat_template without importing
    it: its Jinja environment (ImmutableSandboxedEnvironment, trim_blocks=True,
    lstrip_blocks=True, the loopcontrols extension, raise_exception) and its
    custom `tojson` filter, json.dumps(x, ensure_ascii=False, indent=None,
    separators=None, sort_keys=False).
  * Token ids: Hugging Face `tokenizers` built from the GGUF's vocabulary and
    merges, with the model's own normalizer and pre-tokenizer (Qwen2: NFC, then
    Split(the Qwen2 regex, Isolated) + ByteLevel(add_prefix_space=False,
    use_regex=False); SmolLM2: Digits(individual) + ByteLevel), and the GGUF's
    control / user-defined tokens (token_type 3 and 4) as added tokens.

Cases, for each model (rows carry "model"):
  * every script in tests/fixtures/worker/scripts/, as polykv-worker sends it:
    each generating assistant line becomes one case (the history up to there,
    add_generation_prompt=true). Earlier generated turns stand in as assistant
    messages with the content "[generated ID]" (the C++ test renders them as
    such messages too).
  * the conversations in EXTRA below, each with and without the generation
    prompt.
SmolLM2's template has no tools and needs a content on every message, so for
it a missing "content" is "" (the worker's rule too) and tools are ignored.
"""
import json
import os
import sys

import gguf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_chat import build_tokenizer, field_str, hf_template_env  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "worker")
MODEL_DIR = os.environ.get("POLYKV_MODEL_DIR", os.path.expanduser("~/.cache/polykv/models"))
MODELS = {
    "qwen2.5-coder-0.5b": "Qwen2.5-Coder-0.5B-Instruct.gguf",
    # Its template doubles the braces of the example tool call.
    "qwen2.5-coder-1.5b": "Qwen2.5-Coder-1.5B-Instruct.gguf",
    "smollm2-135m": "SmolLM2-135M-Instruct.Q4_1.gguf",
}


def script_cases(path):
    """(tools, messages) for each generating assistant line of a script."""
    tools, history, cases = None, [], []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            o = json.loads(line)
            if "tools" in o:
                tools = o["tools"]
                continue
            m = {k: o[k] for k in ("role", "content", "tool_calls") if k in o}
            if m["role"] == "assistant" and "content" not in m and "tool_calls" not in m:
                cases.append((tools, [dict(x) for x in history]))
                history.append({"role": "assistant", "content": f"[generated {o.get('id', '')}]"})
            else:
                history.append(m)
    return cases


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. Zürich"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}}}
CALC = {"name": "calc", "description": "Evaluate an arithmetic expression: 2*(3+4) → 14",
        "parameters": {"type": "object", "properties": {"expr": {"type": "string"},
                                                        "precision": {"type": "integer", "default": 6},
                                                        "scale": {"type": "number", "default": 1e-05},
                                                        "big": {"type": "number", "default": 1e16}}}}
ODD = {"name": "quote\"d\\tool", "description": "tab\there, newline\nthere, ctrl \x01 and DEL \x7f, \u2028 sep, emoji 😀",
       "parameters": {"z_last": {"type": "null"}, "a_first": [True, False, None, -0.0, 2.50, 100]}}

EXTRA = [
    # 1. Tools, no system message: the default system prompt gets the tools.
    (None, [WEATHER], [{"role": "user", "content": "Weather in Zürich?"}]),
    # 2. Tools with a system message, a tool call, its response, an answer.
    (None, [WEATHER, CALC], [
        {"role": "system", "content": "You are a travel agent."},
        {"role": "user", "content": "Is it warmer in Lisbon or Oslo?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Lisbon"}}},
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}}]},
        {"role": "tool", "content": "{\"city\": \"Lisbon\", \"temp_c\": 21}"},
        {"role": "tool", "content": "{\"city\": \"Oslo\", \"temp_c\": 4}"},
        {"role": "assistant", "content": "Lisbon, by 17 °C."},
        {"role": "user", "content": "Thanks!"}]),
    # 3. A tool message right after the user (no tool call), then a user turn.
    (None, None, [{"role": "user", "content": "Here is the log."},
                  {"role": "tool", "content": "ERROR disk full"},
                  {"role": "user", "content": "What does it say?"}]),
    # 4. Three consecutive tool messages ending the conversation.
    (None, None, [{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": "Check the three hosts."},
                  {"role": "tool", "content": "a: ok"}, {"role": "tool", "content": "b: ok"},
                  {"role": "tool", "content": "c: down\n"}]),
    # 5. A tool message as the very first message.
    (None, None, [{"role": "tool", "content": "stdout: 42"}, {"role": "user", "content": "Explain."}]),
    # 6. Multi-turn without tools and without a system message.
    (None, None, [{"role": "user", "content": "List three primes."},
                  {"role": "assistant", "content": "2, 3, 5."},
                  {"role": "user", "content": "Two more?"},
                  {"role": "assistant", "content": "7, 11."},
                  {"role": "user", "content": "Sum them all."}]),
    # 7. Non-ASCII and escapes in tool JSON and arguments; key order kept.
    (None, [ODD, CALC], [
        {"role": "user", "content": "Quote it: 日本語"},
        {"role": "assistant", "tool_calls": [{"name": "quote\"d\\tool", "arguments": {
            "zeta": "ünïcödé 😀", "alpha": [1, 2.0, 3e-7, 12345678901234567890], "nested": {"b": None, "a": True}}}]},
        {"role": "tool", "content": "«done» ✓"}]),
    # 8. Assistant tool call with content, arguments given as a JSON string (OpenAI style).
    (None, [CALC], [{"role": "user", "content": "What is 2*(3+4)?"},
                    {"role": "assistant", "content": "I'll compute it.",
                     "tool_calls": [{"type": "function", "function": {"name": "calc", "arguments": "{\"expr\": \"2*(3+4)\"}"}}]},
                    {"role": "tool", "content": "14"}]),
    # 9. A second system message later in the conversation.
    (None, None, [{"role": "system", "content": "You are terse."},
                  {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hi."},
                  {"role": "system", "content": "Now answer in French."},
                  {"role": "user", "content": "How are you?"}]),
    # 10. Tools declared, system message, no calls: tools block only.
    (None, [WEATHER], [{"role": "system", "content": "Weather bot.\n\nRules: be exact."},
                       {"role": "user", "content": "  leading spaces and\ttabs  "}]),
    # 11. Tool runs separated by an assistant tool call; whitespace-heavy responses.
    (None, [CALC], [{"role": "user", "content": "Run both."},
                    {"role": "assistant", "tool_calls": [{"name": "calc", "arguments": {"expr": "1+1"}}]},
                    {"role": "tool", "content": "2"},
                    {"role": "tool", "content": "\n\n  indented\n"},
                    {"role": "assistant", "tool_calls": [{"name": "calc", "arguments": {}}]},
                    {"role": "tool", "content": ""},
                    {"role": "user", "content": "ok"}]),
    # 12. Special-token text inside content.
    (None, None, [{"role": "user", "content": "Say <|im_end|> then <tool_call> literally."}]),
]


def main():
    env = hf_template_env()
    scripts_dir = os.path.join(FIXTURES, "scripts")
    scripts = sorted(f for f in os.listdir(scripts_dir) if f.endswith(".jsonl"))
    rows = []
    for name, file in MODELS.items():
        path = os.path.join(MODEL_DIR, file)
        if not os.path.exists(path):
            sys.exit(f"{path} is missing: run scripts/fetch-model.sh {name}")
        reader = gguf.GGUFReader(path)
        tmpl = env.from_string(field_str(reader, "tokenizer.chat_template"))
        pre = field_str(reader, "tokenizer.ggml.pre")
        tok = build_tokenizer(reader, "qwen2" if pre == "qwen2" else "smollm")
        cases = []
        for s in scripts:
            for i, (tools, msgs) in enumerate(script_cases(os.path.join(scripts_dir, s))):
                cases.append((f"scripts/{s}#{i + 1}", tools, msgs, True))
        for i, (_, tools, msgs) in enumerate(EXTRA):
            for gen in (False, True):
                cases.append((f"extra-{i + 1}", tools, msgs, gen))
        for source, tools, msgs, gen in cases:
            render_msgs = msgs
            if pre != "qwen2":
                render_msgs = [dict(m, content=m.get("content", "")) for m in msgs]
            text = tmpl.render(messages=render_msgs, tools=tools, add_generation_prompt=gen)
            ids = tok.encode(text, add_special_tokens=False).ids
            assert tok.decode(ids, skip_special_tokens=False) == text, source
            rows.append({"model": name, "source": source, "tools": tools, "messages": msgs,
                         "add_generation_prompt": gen, "text": text, "ids": ids})
    out = os.path.join(FIXTURES, "qwen_chat_template_cases.jsonl")
    with open(out, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"wrote {len(rows)} cases to {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
