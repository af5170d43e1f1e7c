"""A GGUF's chat template and tokenizer, rebuilt outside the worker: the
reference that the worker's C++ chat template and tokenizer are tested against
(scripts/make-chat-template-fixtures.py), and the prompt builder of the kvpress
anchor (bench/anchor/kvpress_eval.py), so both see the worker's token ids.

  * hf_template_env(): transformers' apply_chat_template Jinja environment
    (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols,
    raise_exception, its own `tojson`), without importing transformers.
  * build_tokenizer(reader, pre): Hugging Face `tokenizers` from the GGUF's
    vocabulary and merges, with the model's normalizer and pre-tokenizer
    (Qwen2: qwen2_hf_tokenizer.py; SmolLM2: Digits(individual) + ByteLevel),
    control / user-defined tokens (token_type 3 and 4) as added tokens.

Needs gguf (for the reader), jinja2 and tokenizers.
"""
import json
import os
import sys

import jinja2
import jinja2.ext
import jinja2.sandbox
import tokenizers
from tokenizers import AddedToken, decoders, models, pre_tokenizers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from qwen2_hf_tokenizer import qwen2_tokenizer  # noqa: E402


def field_str(reader, key):
    f = reader.fields[key]
    return bytes(f.parts[f.data[0]]).decode("utf-8")


def field_list(reader, key):
    f = reader.fields[key]
    return [f.parts[i] for i in f.data]


def hf_template_env():
    """transformers' _compile_jinja_template environment."""
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


def build_tokenizer(reader, pre):
    tokens = [bytes(p).decode("utf-8") for p in field_list(reader, "tokenizer.ggml.tokens")]
    types = [int(p[0]) for p in field_list(reader, "tokenizer.ggml.token_type")]
    merges = [bytes(p).decode("utf-8") for p in field_list(reader, "tokenizer.ggml.merges")]
    if pre == "qwen2":
        return qwen2_tokenizer(tokens, types, merges)
    # SmolLM2's tokenizer.json.
    tok = tokenizers.Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)},
                                          [tuple(m.split(" ", 1)) for m in merges],
                                          fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty in (3, 4)])
    return tok
