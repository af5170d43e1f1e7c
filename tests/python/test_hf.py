"""polykv.hf: transformers with its KV cache in a real polykvd, loading the
worker's own GGUF files. At f32 pages generation is token-identical to
DynamicCache (multi-turn, both model families); under the shipped default
QoS the session is compacted by the daemon while the model runs on."""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

import polykv
import polykv.hf

from conftest import model_file, pool_problems

transformers.utils.logging.disable_progress_bar()
transformers.utils.logging.set_verbosity_error()

TURNS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "Now make it iterative and add a docstring.",
]


def load(name: str):
    path = model_file(name)
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                 dtype=torch.float32)
    return tok, model.eval()


def converse(model, tok, cache, new_tokens: int = 24) -> list[list[int]]:
    """Two user turns, greedy answers; returns each answer's token ids."""
    messages, answers, ids = [], [], None
    for text in TURNS:
        messages.append({"role": "user", "content": text})
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                      return_dict=True).input_ids
        out = model.generate(ids, past_key_values=cache, max_new_tokens=new_tokens,
                             do_sample=False)
        answer = out[0, ids.shape[1]:].tolist()
        answers.append(answer)
        messages.append({"role": "assistant", "content": tok.decode(answer,
                                                                   skip_special_tokens=True)})
    return answers


@pytest.mark.parametrize("name", ["smollm2", "qwen"])
def test_f32_pages_are_token_identical_to_dynamic_cache(daemon, name):
    tok, model = load(name)
    with torch.no_grad():
        expected = converse(model, tok, DynamicCache(config=model.config))
    daemon.admin.set_qos(polykv.Qos(agent_id=f"exact-{name}", policy="full"))
    model.set_attn_implementation(polykv.hf.ATTN_IMPLEMENTATION)
    cache = polykv.hf.PolykvCache(model.config, agent_id=f"exact-{name}", socket=daemon.socket,
                                  key_format="f32", value_format="f32")
    with torch.no_grad():
        got = converse(model, tok, cache)
    assert got == expected
    [s] = daemon.admin.sessions(agent_id=f"exact-{name}")
    assert (s.key_format, s.value_format) == ("f32", "f32")
    # Every token but each answer's last (generate does not run it) is cached.
    cache.commit()
    [s] = daemon.admin.sessions(agent_id=f"exact-{name}")
    assert s.committed_tokens == cache.num_slots == cache.seen_tokens
    assert cache.epoch == 0
    cache.close()
    assert pool_problems(daemon.admin) == ""


def test_the_shipped_default_qos_compacts_the_session_as_it_runs(daemon):
    tok, model = load("smollm2")
    model.set_attn_implementation(polykv.hf.ATTN_IMPLEMENTATION)
    default = daemon.admin.get_qos("hf-default")
    assert default.policy.startswith("kvzip")
    cache = polykv.hf.PolykvCache(model.config, agent_id="hf-default", socket=daemon.socket)
    assert cache.supports_probe("reconstruct")
    # A context past the default's floor of 1024 tokens.
    text = "\n".join(f"def f{i}(x):\n    return x * {i} + {i % 7}" for i in range(110))
    ids = tok.apply_chat_template(
        [{"role": "user", "content": f"{text}\nWhat does f42(1) return?"}],
        add_generation_prompt=True, return_tensors="pt", return_dict=True).input_ids
    assert ids.shape[1] > 1200
    with pytest.raises(ValueError, match="tokenizer"):
        polykv.hf.prefill(model, cache, ids[:, :4])
    cache.begin_turn("user")
    polykv.hf.prefill(model, cache, ids[:, :-1], tokenizer=tok)
    # The probes attended but kept nothing and took no positions.
    assert cache.seen_tokens == ids.shape[1] - 1
    out = model.generate(ids, past_key_values=cache, max_new_tokens=8, do_sample=False)
    assert out.shape[1] == ids.shape[1] + 8
    [s] = daemon.admin.sessions(agent_id="hf-default")
    assert (s.key_format, s.value_format) == (default.key_format, default.value_format)
    assert cache.epoch >= 1, "the daemon never compacted the session"
    assert cache.num_slots < cache.seen_tokens
    cache.commit()
    [s] = daemon.admin.sessions(agent_id="hf-default")
    assert s.committed_tokens == cache.num_slots
    cache.close()
    assert pool_problems(daemon.admin) == ""


def test_what_the_cache_refuses(daemon):
    tok, model = load("smollm2")
    model.set_attn_implementation(polykv.hf.ATTN_IMPLEMENTATION)
    ids = torch.tensor([[1, 2, 3, 4]])
    with pytest.raises(RuntimeError, match="PolykvCache"):
        model(ids, past_key_values=DynamicCache(config=model.config))
    cache = polykv.hf.PolykvCache(model.config, agent_id="refusals", socket=daemon.socket)
    with pytest.raises(ValueError, match="batch size 1"):
        model(ids.repeat(2, 1), past_key_values=cache)
    with pytest.raises(polykv.errors.InvalidArgument, match="role"):
        cache.begin_turn("narrator")
    cache.begin_turn("user")
    assert (cache._turn, cache._role) == (0, "user")
    with pytest.raises(polykv.errors.InvalidArgument, match="not a page format"):
        polykv.hf.PolykvCache(model.config, agent_id="refusals", socket=daemon.socket,
                              key_format="q4_0")
