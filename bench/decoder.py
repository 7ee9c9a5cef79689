"""Benchmark of the modern decoder on the CPU: ours vs HF Llama, and KV cache vs recomputation.

Run by hand (``make bench``); it is not a test, since timings depend on the machine.
Config: vocab 1000, d_model 256, 4 layers, 8 heads, 2 KV heads; a 256-token prompt and
128 greedy new tokens; ``torch.set_num_threads(2)``.

There is one round per attention implementation of HF Llama (``sdpa``, then ``eager``). In
each round both models are built with the same weights, checked to generate the same tokens,
and timed alternately, run after run; every number printed is a median over the runs of its
round, and every ratio divides two numbers printed on the same line, both from that round.
"""
from __future__ import annotations

import argparse
import functools
import inspect
import os
import statistics
import time

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from transformer_lib.convert import decoder_from_hf_llama  # noqa: E402

VOCAB, D_MODEL, LAYERS, HEADS, KV_HEADS, D_FF = 1000, 256, 4, 8, 2, 688
PROMPT, NEW = 256, 128


def build_models(attn_implementation: str):
    """A randomly initialised HF Llama (same weights for every ``attn_implementation``) and our
    decoder converted from it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=D_MODEL, intermediate_size=D_FF, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
        max_position_embeddings=PROMPT + NEW, attn_implementation=attn_implementation,
    )
    torch.manual_seed(0)
    hf = LlamaForCausalLM(config).eval()
    return hf, decoder_from_hf_llama(hf).eval()


def timed(fn, *args, **kwargs) -> float:
    """Seconds taken by ``fn(*args, **kwargs)``."""
    start = time.perf_counter()
    fn(*args, **kwargs)
    return time.perf_counter() - start


def ours_prefill(model, prompt):
    cache = model.new_cache(prompt.shape[0])
    return model(prompt, cache), cache


def ours_decode(model, logits, cache):
    token = logits[:, -1:].argmax(-1)  # (B, 1)
    for _ in range(NEW):
        token = model(token, cache)[:, -1:].argmax(-1)


@functools.cache
def hf_cache_argument(model_class: type) -> str:
    """The name of the KV-cache argument of ``model_class.forward``: ``cache`` in recent
    transformers (where ``past_key_values`` is deprecated), ``past_key_values`` before."""
    parameters = inspect.signature(model_class.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def hf_prefill(hf, prompt):
    from transformers import DynamicCache

    cache = DynamicCache()  # filled in place by every forward
    logits = hf(prompt, use_cache=True, **{hf_cache_argument(type(hf)): cache}).logits
    return logits, cache


def hf_decode(hf, logits, cache):
    token = logits[:, -1:].argmax(-1)  # (B, 1)
    argument = hf_cache_argument(type(hf))
    for _ in range(NEW):
        token = hf(token, use_cache=True, **{argument: cache}).logits[:, -1:].argmax(-1)


def check_same_tokens(ours, hf, prompt) -> None:
    """Both models generate the same greedy tokens: they compute the same function."""
    short = prompt[:, :32]
    expected = hf.generate(short, max_new_tokens=8, min_new_tokens=8, do_sample=False,
                           attention_mask=torch.ones_like(short), pad_token_id=0)
    assert torch.equal(ours.generate(short, 8), expected)


def time_round(ours, hf, prompt, repeats: int) -> dict[str, float]:
    """Median seconds of ``ours_prefill``, ``hf_prefill``, ``ours_decode`` and ``hf_decode`` (per
    token), the two models timed alternately within each of ``repeats`` runs."""
    times: dict[str, list[float]] = {
        k: [] for k in ("ours_prefill", "hf_prefill", "ours_decode", "hf_decode")}
    for run in range(repeats + 1):  # run 0 warms up and is dropped
        t = {"ours_prefill": timed(ours_prefill, ours, prompt)}
        t["ours_decode"] = timed(ours_decode, ours, *ours_prefill(ours, prompt)) / NEW
        t["hf_prefill"] = timed(hf_prefill, hf, prompt)
        t["hf_decode"] = timed(hf_decode, hf, *hf_prefill(hf, prompt)) / NEW
        if run > 0:
            for k, v in t.items():
                times[k].append(v)
    return {k: statistics.median(v) for k, v in times.items()}


def time_kv_cache(ours, prompt, repeats: int) -> tuple[float, float]:
    """Median seconds of generating ``NEW`` tokens after ``prompt`` with and without the KV
    cache, the two timed alternately."""
    cached, recomputed = [], []
    for run in range(repeats + 1):  # run 0 warms up and is dropped
        c = timed(ours.generate, prompt, NEW, use_cache=True)
        r = timed(ours.generate, prompt, NEW, use_cache=False)
        if run > 0:
            cached.append(c)
            recomputed.append(r)
    return statistics.median(cached), statistics.median(recomputed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per median")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    prompt = torch.randint(0, VOCAB, (1, PROMPT))  # (B, T)
    rounds = {}
    with torch.inference_mode():
        for impl in ("sdpa", "eager"):  # one round per HF attention implementation
            hf, ours = build_models(impl)
            check_same_tokens(ours, hf, prompt)
            rounds[impl] = time_round(ours, hf, prompt, args.repeats)
        cached_s, recomputed_s = time_kv_cache(ours, prompt, args.repeats)

    import transformers

    print(f"decoder: vocab {VOCAB}, d_model {D_MODEL}, {LAYERS} layers, {HEADS} heads, "
          f"{KV_HEADS} KV heads; prompt {PROMPT}, {NEW} new tokens; {args.threads} threads; "
          f"torch {torch.__version__}, transformers {transformers.__version__}; "
          f"medians of {args.repeats} runs")
    print()
    print("| measurement | HF attention | ours | HF Llama | ours / HF |")
    print("|---|---|---|---|---|")
    rows = (("prefill, 256 tokens (ms)", "prefill"), ("decode, per token (ms)", "decode"))
    for name, key in rows:
        for impl, t in rounds.items():
            ours_ms, hf_ms = t[f"ours_{key}"] * 1e3, t[f"hf_{key}"] * 1e3
            print(f"| {name} | {impl} | {ours_ms:.2f} | {hf_ms:.2f} | {ours_ms / hf_ms:.2f}x |")
    print()
    print("| generation of 128 tokens after 256 (s) | with KV cache | recomputing the prefix "
          "| speed-up |")
    print("|---|---|---|---|")
    print(f"| ours | {cached_s:.3f} | {recomputed_s:.3f} | {recomputed_s / cached_s:.1f}x |")


if __name__ == "__main__":
    main()
