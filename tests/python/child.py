"""A second Python process for the isolation and crash tests.

    child.py hold SOCKET TENANT MARKER   open a session, fill its pages with
        byte MARKER, commit, print {"session_id", "token", "arenas"} as one
        JSON line, then wait for stdin to close
    child.py generate SOCKET TENANT MODEL   run SmolLM2 through polykv.hf,
        print "generating" once the first tokens are cached, then go on
        generating until killed
"""

from __future__ import annotations

import json
import sys

import polykv


def hold(socket: str, tenant: str, marker: int) -> None:
    profile = polykv.ModelProfile(num_layers=2, num_kv_heads=2, head_dim=64, dtype="f32")
    with polykv.Client(socket) as client, \
            client.open_session("holder", profile, tenant=tenant) as s:
        s.reserve(64)
        for b, block in enumerate(s.blocks):
            for p in range(len(block.pages)):
                s.page(b, p)[:] = marker
        s.commit(64)
        arenas = sorted({page.arena_id for block in s.blocks for page in block.pages})
        print(json.dumps({"session_id": s.info.session_id, "token": s.token.hex(),
                          "arenas": arenas}), flush=True)
        sys.stdin.read()


def generate(socket: str, tenant: str, model_path: str) -> None:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    import polykv.hf

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    folder, name = model_path.rsplit("/", 1)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32,
                                                 attn_implementation="polykv")
    cache = polykv.hf.PolykvCache(model.config, agent_id="crasher", tenant=tenant,
                                  socket=socket)
    ids = torch.tensor([[1] + list(range(100, 164))])
    with torch.no_grad():
        model(ids, past_key_values=cache, use_cache=True)
        print("generating", flush=True)
        while True:
            logits = model(ids[:, -1:], past_key_values=cache, use_cache=True).logits
            ids = logits[:, -1:].argmax(-1)


if __name__ == "__main__":
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "hold":
        hold(args[0], args[1], int(args[2]))
    elif mode == "generate":
        generate(*args)
    else:
        sys.exit(f"unknown mode {mode}")
