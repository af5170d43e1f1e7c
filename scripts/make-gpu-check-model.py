#!/usr/bin/env python3
"""Cuts SmolLM2-135M down to a model small enough to travel to the GPU machine.

    make-gpu-check-model.py SRC.gguf DST.gguf [--layers 4] [--vocab 4096]

The GPU check (scripts/gpu-check.sh) compares the reference worker's greedy
output with its pages on the GPU against the same run with host pages; any
model of the worker's architecture does for that, but the device tool carries
at most 64 MiB and SmolLM2-135M is 98 MB. This keeps the first --layers
transformer blocks and the first --vocab tokens (the embedding's rows, the
tokenizer's tokens and only the merges whose parts and result stay in the
vocabulary, so the tokenizer never makes a token the model lacks): 12 MB.
Its text is nonsense; CPU and GPU must still agree token for token.

Reads and writes GGUF with the `gguf` package (gguf-py); the weights keep their
quantized bytes as they are.
"""
import argparse
import sys

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter


def field_value(field):
    """A reader field as a Python value (lists for arrays, str for strings)."""
    kind = field.types[0]
    if kind == GGUFValueType.ARRAY:
        sub = field.types[1]
        items = [field.parts[i] for i in field.data]
        if sub == GGUFValueType.STRING:
            return [bytes(x).decode("utf-8") for x in items], sub
        return [x.tolist()[0] for x in items], sub
    part = field.parts[field.data[0]]
    if kind == GGUFValueType.STRING:
        return bytes(part).decode("utf-8"), None
    return part.tolist()[0], None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=4096)
    a = ap.parse_args()

    r = GGUFReader(a.src)
    arch, _ = field_value(r.fields["general.architecture"])
    layers, _ = field_value(r.fields[f"{arch}.block_count"])
    tokens, _ = field_value(r.fields["tokenizer.ggml.tokens"])
    if a.layers < 1 or a.layers > layers or a.vocab < 256 or a.vocab > len(tokens):
        sys.exit(f"make-gpu-check-model: want 1..{layers} layers and 256..{len(tokens)} tokens")
    kept = set(tokens[: a.vocab])

    w = GGUFWriter(a.dst, arch)
    for name, field in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        value, sub = field_value(field)
        if name == f"{arch}.block_count":
            value = a.layers
        elif name == f"{arch}.vocab_size":
            value = a.vocab
        elif name in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                      "tokenizer.ggml.scores"):
            value = value[: a.vocab]
        elif name == "tokenizer.ggml.merges":
            value = [m for m in value
                     if all(p in kept for p in m.split(" ")) and m.replace(" ", "") in kept]
        if field.types[0] == GGUFValueType.ARRAY:
            w.add_key_value(name, value, GGUFValueType.ARRAY, sub_type=sub)
        else:
            w.add_key_value(name, value, field.types[0])

    for t in r.tensors:
        if t.name.startswith("blk.") and int(t.name.split(".")[1]) >= a.layers:
            continue
        data = np.asarray(t.data)
        if t.name in ("token_embd.weight", "output.weight"):
            data = data[: a.vocab]  # one row per token
        w.add_tensor(t.name, np.ascontiguousarray(data), raw_dtype=t.tensor_type)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
