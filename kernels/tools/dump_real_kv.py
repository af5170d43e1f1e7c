#!/usr/bin/env python3
"""Dumps real keys, values and queries of a small Llama-family model for the
fidelity study of `polykv-bench kernels --real-kv DIR` (docs/formats.md).

Runs the model (GGUF, dequantized by transformers, CPU) over a fixed text,
captures for a few layers the post-RoPE keys and values of every position and
the post-RoPE queries of the last NQ positions, and writes raw little-endian
f32 files:
  DIR/meta.txt            "T H HQ D NQ" then the layer indices
  DIR/layer<L>_k.f32      [T][H][D]
  DIR/layer<L>_v.f32      [T][H][D]
  DIR/layer<L>_q.f32      [NQ][HQ][D] (queries of positions T-NQ .. T-1)
  DIR/layer<L>_kpre.f32   [T][H][D] the same keys before RoPE
  DIR/rope_cos.f32, DIR/rope_sin.f32   [T][D] the rotation applied to them
                          (k = kpre * cos + rotate_half(kpre) * sin)
Needs torch, transformers, gguf (scripts/requirements-worker-fixtures.txt).
Usage: dump_real_kv.py MODEL.gguf TEXT_FILE OUT_DIR [max_tokens]
"""
import os
import sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.models.llama import modeling_llama


def main():
    gguf_path, text_path, out_dir = sys.argv[1], sys.argv[2], sys.argv[3]
    max_tokens = int(sys.argv[4]) if len(sys.argv) > 4 else 2048
    nq = 8
    os.makedirs(out_dir, exist_ok=True)
    d, f = os.path.split(os.path.abspath(gguf_path))
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, torch_dtype=torch.float32)
    model.eval()
    ids = tok(open(text_path).read(), return_tensors="pt").input_ids[:, :max_tokens]
    T = ids.shape[1]
    cfg = model.config
    n_layers = cfg.num_hidden_layers
    layers = sorted({0, n_layers // 4, n_layers // 2, 3 * n_layers // 4, n_layers - 1})
    hq, h = cfg.num_attention_heads, cfg.num_key_value_heads
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // hq
    captured = {}

    def hook(layer):
        def fn(module, args, kwargs):
            hs = kwargs.get("hidden_states", args[0] if args else None)
            cos, sin = kwargs["position_embeddings"]
            shape = (*hs.shape[:-1], -1, hd)
            q = module.q_proj(hs).view(shape).transpose(1, 2)
            k = module.k_proj(hs).view(shape).transpose(1, 2)
            v = module.v_proj(hs).view(shape).transpose(1, 2)
            kpre = k
            q, k = modeling_llama.apply_rotary_pos_emb(q, k, cos, sin)
            captured[layer] = (q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1),
                               kpre[0].transpose(0, 1))
            captured["rope"] = (cos[0], sin[0])
        return fn

    for L in layers:
        model.model.layers[L].self_attn.register_forward_pre_hook(hook(L), with_kwargs=True)
    with torch.no_grad():
        model(ids)
    with open(os.path.join(out_dir, "meta.txt"), "w") as m:
        m.write(f"{T} {h} {hq} {hd} {nq}\n" + " ".join(map(str, layers)) + "\n")

    def write(x, name):
        np.ascontiguousarray(x.numpy(), dtype="<f4").tofile(os.path.join(out_dir, name))

    write(captured["rope"][0], "rope_cos.f32")
    write(captured["rope"][1], "rope_sin.f32")
    for L in layers:
        q, k, v, kpre = captured[L]  # [T][heads][D]
        write(kpre, f"layer{L}_kpre.f32")
        write(k, f"layer{L}_k.f32")
        write(v, f"layer{L}_v.f32")
        write(q[T - nq:], f"layer{L}_q.f32")
    print(f"wrote {out_dir}: T={T} H={h} HQ={hq} D={hd} layers={layers}")


if __name__ == "__main__":
    main()
