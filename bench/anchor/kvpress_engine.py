"""The model side of the kvpress anchor (kvpress_eval.py): the model on the
GGUF's weights, the worker's prompt, kvpress's presses applied to a recorded
prefill, greedy answers and teacher-forced log-probabilities. The only module
of the anchor that imports torch (lazily, in Engine)."""
from __future__ import annotations

import copy
import os
import time


class Engine:
    """The model, the prompt builder and the presses of one run."""

    def __init__(self, model_path: str, threads: int):
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("TQDM_DISABLE", "1")  # the GGUF loader's progress bar
        import gguf
        import torch
        import transformers
        import kvpress  # noqa: F401  (patches the attention functions for masked presses)
        from gguf_chat import build_tokenizer, field_str, hf_template_env

        transformers.utils.logging.disable_progress_bar()
        self.torch, self.transformers = torch, transformers
        if threads:
            torch.set_num_threads(threads)
        reader = gguf.GGUFReader(model_path)
        if field_str(reader, "tokenizer.ggml.pre") != "qwen2":
            raise ValueError(f"{model_path}: the anchor supports Qwen2 GGUFs (the models of "
                             "the evaluation)")
        self.template_text = field_str(reader, "tokenizer.chat_template")
        self.template = hf_template_env().from_string(self.template_text)
        self.tok = build_tokenizer(reader, "qwen2")
        self.stop_ids = {self.tok.token_to_id(t) for t in ("<|im_end|>", "<|endoftext|>")}
        del reader
        t0 = time.time()
        self.model = transformers.AutoModelForCausalLM.from_pretrained(
            os.path.dirname(model_path), gguf_file=os.path.basename(model_path),
            dtype=torch.float32)
        self.model.eval()
        cfg = self.model.config
        self.layers = cfg.num_hidden_layers
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.load_seconds = time.time() - t0
        self._tokenizer_dir = None

    def renderer(self, tools):
        return lambda msgs, generation_prompt: self.template.render(
            messages=msgs, tools=tools, add_generation_prompt=generation_prompt)

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    def bytes_per_token_f16(self) -> int:
        return self.layers * 2 * self.kv_heads * self.head_dim * 2

    def hf_tokenizer_dir(self, out_dir: str) -> str:
        """KVzip loads a transformers tokenizer from model.config.name_or_path
        (for its "Repeat the previous context" prompt and the template's
        suffix): this one is the GGUF's, saved once per run."""
        if self._tokenizer_dir is None:
            d = os.path.join(out_dir, ".hf-tokenizer")
            t = self.transformers.PreTrainedTokenizerFast(
                tokenizer_object=self.tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
            t.chat_template = self.template_text
            t.save_pretrained(d)
            self._tokenizer_dir = d
        return self._tokenizer_dir

    def make_press(self, name: str, keep: float):
        from kvpress import (AdaKVPress, ExpectedAttentionPress, KVzipPress, SnapKVPress,
                             StreamingLLMPress)
        ratio = 1.0 - keep
        if name == "streaming":
            return StreamingLLMPress(compression_ratio=ratio)
        if name == "snapkv":
            return SnapKVPress(compression_ratio=ratio)
        if name == "expected":
            return ExpectedAttentionPress(compression_ratio=ratio)
        if name == "adakv-expected":
            return AdaKVPress(ExpectedAttentionPress(compression_ratio=ratio))
        if name == "kvzip":
            return KVzipPress(compression_ratio=ratio)
        if name == "kvzip-lw":
            return KVzipPress(compression_ratio=ratio, layerwise=True)
        raise ValueError(name)

    # -- per task ----------------------------------------------------------

    def attn_modules(self):
        return [layer.self_attn for layer in self.model.model.layers]

    def clear_masks(self):
        for m in self.attn_modules():
            m.masked_key_indices = None

    def prefill(self, ctx_ids: list[int], kvzip_keeps: list[float], out_dir: str):
        """The full cache, each layer's hook inputs (for replaying presses),
        and KVzip's per-layer scores (None without KVzip)."""
        torch = self.torch
        recorded = {}
        recording = [True]

        def record(module, args, kwargs, output):
            if recording[0]:
                kw = {k: v for k, v in kwargs.items() if k != "past_key_values"}
                recorded[module.layer_idx] = (module, kw, (output[0], None))
            return output

        hooks = [m.register_forward_hook(record, with_kwargs=True) for m in self.attn_modules()]
        cache = self.transformers.DynamicCache()
        ids = torch.tensor([ctx_ids])
        scores = None
        try:
            with torch.inference_mode():
                if kvzip_keeps:
                    press = _kvzip_keeping_scores(self, kvzip_keeps[0], out_dir)
                    with press(self.model):
                        self.model(input_ids=ids, past_key_values=cache, logits_to_keep=1)
                        recording[0] = False
                        # kvpress skips the template's header of a one-message
                        # context; ours is a whole conversation, all of it
                        # reconstructed (the first n_sink pairs stay sinks).
                        press.prefix_length = 0
                    scores = press.kept_scores
                else:
                    self.model(input_ids=ids, past_key_values=cache, logits_to_keep=1)
        finally:
            for h in hooks:
                h.remove()
            self.clear_masks()
        if len(recorded) != self.layers:
            raise RuntimeError(f"recorded {len(recorded)} of {self.layers} layers")
        for i, layer in enumerate(cache.layers):
            if layer.keys.shape[2] != len(ctx_ids):
                raise RuntimeError(f"layer {i} holds {layer.keys.shape[2]} of {len(ctx_ids)} pairs "
                                   "after the prefill")
        return cache, recorded, scores

    def compress(self, name: str, keep: float, full_cache, recorded, kvzip_scores):
        """A copy of the full cache compressed by the press, its masks set on
        the modules; returns (cache, kept fraction of the context's pairs)."""
        cache = copy.deepcopy(full_cache)
        ctx = full_cache.layers[0].keys.shape[2]
        press = None if name in TOKEN_SELECTIONS else self.make_press(name, keep)
        self.clear_masks()
        with self.torch.inference_mode():
            if name in TOKEN_SELECTIONS:
                for m, idx in zip(self.attn_modules(),
                                  token_masks(self.torch, kvzip_scores, keep, name)):
                    m.masked_key_indices = idx
            elif name.startswith("kvzip"):
                press.post_init_from_model(self.model)
                press.score_val = kvzip_scores.clone()
                press.compress_post(self.model)
            else:
                press.post_init_from_model(self.model)
                for i in range(self.layers):
                    module, kw, output = recorded[i]
                    press.forward_hook(module, [], dict(kw, past_key_values=cache), output)
        held = 0
        for i, m in enumerate(self.attn_modules()):
            n = cache.layers[i].keys.shape[2] * self.kv_heads
            mask = getattr(m, "masked_key_indices", None)
            if mask is not None:
                n -= int(mask[0].numel())
            held += n
        return cache, held / (self.layers * self.kv_heads * ctx)

    def replay_error(self, name: str, keep: float, ctx_ids: list[int], replayed) -> float:
        """The replay's check, one prefill: the press run for real (its own
        hooks during a prefill) must leave the same masks as the replay that
        `compress` set on the modules, and a cache of the same shapes; returns
        the largest |difference| of their keys and values."""
        torch = self.torch
        want = [mask_set(m) for m in self.attn_modules()]
        press = self.make_press(name, keep)
        cache = self.transformers.DynamicCache()
        self.clear_masks()
        try:
            with torch.inference_mode(), press(self.model):
                self.model(input_ids=torch.tensor([ctx_ids]), past_key_values=cache,
                           logits_to_keep=1)
            got = [mask_set(m) for m in self.attn_modules()]
        finally:
            self.clear_masks()
        if got != want:
            raise RuntimeError(f"{name}: the replay masks other pairs than the press's own hook")
        err = 0.0
        for i, (a, b) in enumerate(zip(replayed.layers, cache.layers)):
            if a.keys.shape != b.keys.shape:
                raise RuntimeError(f"{name}: layer {i} holds {tuple(a.keys.shape)} replayed, "
                                   f"{tuple(b.keys.shape)} from the press's own hook")
            err = max(err, float((a.keys - b.keys).abs().max()),
                      float((a.values - b.values).abs().max()))
        return err

    def answer(self, cache, ctx_len: int, q_ids: list[int], max_new: int) -> tuple[list, float]:
        """Greedy tokens (the stop token included, as the worker reports) and
        seconds; the question at positions ctx_len... whatever the cache holds."""
        torch = self.torch
        t0 = time.time()
        out = []
        with torch.inference_mode():
            pos = torch.arange(ctx_len, ctx_len + len(q_ids)).unsqueeze(0)
            logits = self.model(input_ids=torch.tensor([q_ids]), past_key_values=cache,
                                position_ids=pos, logits_to_keep=1).logits[0, -1]
            nxt = ctx_len + len(q_ids)
            for _ in range(max_new):
                t = int(logits.argmax())
                out.append(t)
                if t in self.stop_ids or len(out) == max_new:
                    break
                logits = self.model(input_ids=torch.tensor([[t]]), past_key_values=cache,
                                    position_ids=torch.tensor([[nxt]])).logits[0, -1]
                nxt += 1
        return out, time.time() - t0

    def forced_logprobs(self, cache, ctx_len: int, q_ids: list[int], ref: list[int]):
        """Log-probabilities before each reference answer token, teacher-forced."""
        torch = self.torch
        inp = q_ids + ref[:-1]
        with torch.inference_mode():
            pos = torch.arange(ctx_len, ctx_len + len(inp)).unsqueeze(0)
            logits = self.model(input_ids=torch.tensor([inp]), past_key_values=cache,
                                position_ids=pos).logits[0, len(q_ids) - 1:]
            return torch.log_softmax(logits.float(), dim=-1)

    def forced_measures(self, ref_lp, lp) -> dict:
        torch = self.torch
        kl = (ref_lp.exp() * (ref_lp - lp)).sum(-1).clamp_min(0)
        top1 = (ref_lp.argmax(-1) == lp.argmax(-1)).float()
        return {"forced_positions": int(kl.numel()), "kl_mean": round(float(kl.mean()), 8),
                "kl_max": round(float(kl.max()), 6), "top1_agreement": round(float(top1.mean()), 6)}


# KVzip's scores with coarser selections than kvpress's (which drops single
# (layer, KV head, token) pairs under one threshold): what polykv's paged
# tables can hold. A page holds all KV heads of one layer, so a token is kept
# or dropped in all heads of a layer at once; its score in a layer is the most
# any head gave it.
#   kvzip-layer:    each layer keeps its own tokens, the same count per layer
#                   (per-layer block tables of one length);
#   kvzip-layervar: each layer keeps its own tokens, counts from one
#                   threshold over all layers (per-layer tables of any length);
#   kvzip-one:      one selection for every layer, by the most over layers
#                   (polykv's layer-uniform compaction today).
TOKEN_SELECTIONS = ("kvzip-layer", "kvzip-layervar", "kvzip-one")


def token_masks(torch, scores, keep: float, mode: str) -> list:
    """Per layer, the masked_key_indices (batch, head, position) of a
    token-level selection of KVzip's scores [layers, 1, kv_heads, ctx]."""
    layers, _, heads, ctx = scores.shape
    per_token = scores[:, 0].amax(dim=1)  # [layers, ctx]
    drop = ctx - min(ctx, max(1, round(keep * ctx)))
    if mode == "kvzip-one":
        order = torch.argsort(per_token.amax(dim=0))
        dropped = [order[:drop]] * layers
    elif mode == "kvzip-layer":
        dropped = [torch.argsort(per_token[l])[:drop] for l in range(layers)]
    elif mode == "kvzip-layervar":
        flat = torch.argsort(per_token.reshape(-1))[:drop * layers]
        dropped = [flat[flat // ctx == l] % ctx for l in range(layers)]
    else:
        raise ValueError(mode)
    out = []
    for pos in dropped:
        pos = pos.sort().values
        n = int(pos.numel())
        out.append((torch.zeros(n * heads, dtype=torch.long),
                    torch.arange(heads).repeat_interleave(n), pos.repeat(heads)))
    return out


def mask_set(module) -> set:
    """The (batch, head, position) triples a masked press hides, as a set."""
    m = getattr(module, "masked_key_indices", None)
    return set() if m is None else set(zip(*(t.tolist() for t in m)))


def _kvzip_keeping_scores(engine: Engine, keep: float, out_dir: str):
    """A KVzipPress that keeps its per-layer scores after scoring (kvpress
    resets them when its context manager exits); the scores are the same for
    every ratio, so one reconstruction serves every KEEP."""
    from kvpress import KVzipPress

    class KVzipKeepingScores(KVzipPress):
        kept_scores = None

        def compress_post(self, model):
            self.kept_scores = self.score_val.clone()
            super().compress_post(model)

    engine.model.config.name_or_path = engine.hf_tokenizer_dir(out_dir)
    return KVzipKeepingScores(compression_ratio=1.0 - keep)
