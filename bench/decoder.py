"""Benchmark of the modern decoder on the CPU: KV cache vs recomputation, and ours vs HF Llama.

Run by hand (``make bench``); it is not a test, since timings depend on the machine.
Config: vocab 1000, d_model 256, 4 layers, 8 heads, 2 KV heads; a 256-token prompt and
128 greedy new tokens; ``torch.set_num_threads(2)``. Every number is the median of several
runs, and the implementations are timed alternately in the same process, so the ratios
compare like with like.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from transformer_lib.convert import decoder_from_hf_llama  # noqa: E402

VOCAB, D_MODEL, LAYERS, HEADS, KV_HEADS, D_FF = 1000, 256, 4, 8, 2, 688
PROMPT, NEW = 256, 128


def build_models(attn_implementation: str):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=D_MODEL, intermediate_size=D_FF, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
        max_position_embeddings=PROMPT + NEW, attn_implementation=attn_implementation,
    )
    hf = LlamaForCausalLM(config).eval()
    return hf, decoder_from_hf_llama(hf).eval()


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def ours_prefill(model, prompt):
    cache = model.new_cache(prompt.shape[0])
    return model(prompt, cache), cache


def ours_decode(model, prompt, logits, cache):
    token = logits[:, -1:].argmax(-1)  # (B, 1)
    for _ in range(NEW):
        token = model(token, cache)[:, -1:].argmax(-1)


def hf_prefill(hf, prompt):
    out = hf(prompt, use_cache=True)
    return out.logits, out.past_key_values


def hf_decode(hf, prompt, logits, past):
    token = logits[:, -1:].argmax(-1)  # (B, 1)
    for _ in range(NEW):
        out = hf(token, past_key_values=past, use_cache=True)
        past, token = out.past_key_values, out.logits[:, -1:].argmax(-1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    prompt = torch.randint(0, VOCAB, (1, PROMPT))
    results = {}
    for impl in ("sdpa", "eager"):
        hf, ours = build_models(impl)
        with torch.inference_mode():
            assert torch.equal(ours.generate(prompt[:, :32], 8), hf.generate(
                prompt[:, :32], max_new_tokens=8, do_sample=False, min_new_tokens=8,
                attention_mask=torch.ones(1, 32, dtype=torch.long), pad_token_id=0))
            times = {k: [] for k in ("ours_prefill", "hf_prefill", "ours_decode", "hf_decode")}
            for _ in range(args.repeats + 1):  # the first round warms up and is dropped
                t = {}
                t["ours_prefill"] = timed(lambda: ours_prefill(ours, prompt))
                logits, cache = ours_prefill(ours, prompt)
                t["ours_decode"] = timed(lambda: ours_decode(ours, prompt, logits, cache)) / NEW
                t["hf_prefill"] = timed(lambda: hf_prefill(hf, prompt))
                logits, past = hf_prefill(hf, prompt)
                t["hf_decode"] = timed(lambda: hf_decode(hf, prompt, logits, past)) / NEW
                for k, v in t.items():
                    times[k].append(v)
            results[impl] = {k: statistics.median(v[1:]) for k, v in times.items()}
    with torch.inference_mode():
        cached, recomputed = [], []
        for _ in range(max(2, args.repeats // 2) + 1):
            cached.append(timed(lambda: ours.generate(prompt, NEW, use_cache=True)))
            recomputed.append(timed(lambda: ours.generate(prompt, NEW, use_cache=False)))
        cached_s, recomputed_s = statistics.median(cached[1:]), statistics.median(recomputed[1:])

    ms = 1e3
    print(f"decoder: vocab {VOCAB}, d_model {D_MODEL}, {LAYERS} layers, {HEADS} heads, "
          f"{KV_HEADS} KV heads; prompt {PROMPT}, {NEW} new tokens; {args.threads} threads; "
          f"torch {torch.__version__}; medians of {args.repeats}")
    print()
    print("| measurement | ours | HF Llama (sdpa) | ratio | HF Llama (eager) | ratio |")
    print("|---|---|---|---|---|---|")
    for name, key in (("prefill, 256 tokens (ms)", "prefill"), ("decode, per token (ms)", "decode")):
        o = results["sdpa"][f"ours_{key}"]
        s, e = results["sdpa"][f"hf_{key}"], results["eager"][f"hf_{key}"]
        o_e = results["eager"][f"ours_{key}"]
        print(f"| {name} | {o * ms:.2f} | {s * ms:.2f} | {o / s:.2f}x | {e * ms:.2f} | {o_e / e:.2f}x |")
    print()
    print("| generation of 128 tokens after 256 (s) | with KV cache | recomputing the prefix | speed-up |")
    print("|---|---|---|---|")
    print(f"| ours | {cached_s:.3f} | {recomputed_s:.3f} | {recomputed_s / cached_s:.1f}x |")


if __name__ == "__main__":
    main()
