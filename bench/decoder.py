"""Benchmark of the modern decoder on the CPU: ours vs HF Llama, and KV cache vs recomputation.

Run by hand (``make bench``); it is not a test, since timings depend on the machine.
Config: vocab 1000, d_model 256, 4 layers, 8 heads, 2 KV heads; a 256-token prompt and
128 greedy new tokens; ``torch.set_num_threads(2)``.

Four models with the same weights: HF Llama with its ``sdpa`` and its ``eager`` attention,
and ours with ``attn_implementation="eager"`` (the reference) and ``"sdpa"`` (the fused
path). All four are checked to generate the same tokens, then timed in one round: in each
run every model is timed (prefill three times, decoding once), one after the other, the order
rotating from run to run.
Every number printed is a median over the timings of that one round, so each ratio divides two
numbers measured side by side. The load average is printed before and after: the machine
may be shared.
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

from transformer_lib.convert import decoder_from_hf_llama
from transformer_lib.decoder import Decoder

VOCAB, D_MODEL, LAYERS, HEADS, KV_HEADS, D_FF = 1000, 256, 4, 8, 2, 688
PROMPT, NEW = 256, 128
PREFILLS_PER_RUN = 3  # a prefill is short: time it a few times per run, for a steadier median
NAMES = ("ours eager", "ours sdpa", "HF sdpa", "HF eager")  # the columns, in this order


def build_models() -> dict:
    """A randomly initialised HF Llama with sdpa and with eager attention, and ours with the
    eager and the sdpa path, all four with the same weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    def hf_config(attn_implementation: str) -> LlamaConfig:
        return LlamaConfig(
            vocab_size=VOCAB, hidden_size=D_MODEL, intermediate_size=D_FF,
            num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
            max_position_embeddings=PROMPT + NEW, attn_implementation=attn_implementation,
        )

    torch.manual_seed(0)
    hf_sdpa = LlamaForCausalLM(hf_config("sdpa")).eval()
    hf_eager = LlamaForCausalLM(hf_config("eager")).eval()
    hf_eager.load_state_dict(hf_sdpa.state_dict())
    ours_eager = decoder_from_hf_llama(hf_sdpa).eval()
    ours_sdpa = decoder_from_hf_llama(hf_sdpa, attn_implementation="sdpa").eval()
    return {"ours eager": ours_eager, "ours sdpa": ours_sdpa, "HF sdpa": hf_sdpa,
            "HF eager": hf_eager}


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


def greedy(model, prompt, n: int):
    """``n`` greedy new tokens after ``prompt``, with either model's ``generate``."""
    if isinstance(model, Decoder):
        return model.generate(prompt, n)
    return model.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                          attention_mask=torch.ones_like(prompt), pad_token_id=0)


def check_same_tokens(models: dict, prompt) -> None:
    """All four generate the same greedy tokens: they compute the same function."""
    expected = greedy(models["HF sdpa"], prompt[:, :32], 8)
    for name, model in models.items():
        assert torch.equal(greedy(model, prompt[:, :32], 8), expected), name


def time_round(models: dict, prompt, repeats: int) -> dict[str, dict[str, float]]:
    """Median seconds of prefill and of decoding (per token) of every model, the models timed
    one after the other within each of ``repeats`` runs, in an order that rotates; in each run
    a model's prefill is timed ``PREFILLS_PER_RUN`` times, then its decoding once."""
    times = {name: {"prefill": [], "decode": []} for name in models}
    names = list(models)
    for run in range(repeats + 1):  # run 0 warms up and is dropped
        shift = run % len(names)
        for name in names[shift:] + names[:shift]:
            model = models[name]
            ours = isinstance(model, Decoder)
            prefill, decode = (ours_prefill, ours_decode) if ours else (hf_prefill, hf_decode)
            t_prefill = [timed(prefill, model, prompt) for _ in range(PREFILLS_PER_RUN)]
            t_decode = timed(decode, model, *prefill(model, prompt)) / NEW
            if run > 0:
                times[name]["prefill"] += t_prefill
                times[name]["decode"].append(t_decode)
    return {name: {k: statistics.median(v) for k, v in t.items()} for name, t in times.items()}


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
    load_before = os.getloadavg()[0]
    with torch.inference_mode():
        models = build_models()
        check_same_tokens(models, prompt)
        t = time_round(models, prompt, args.repeats)
        cached_s, recomputed_s = time_kv_cache(models["ours eager"], prompt, args.repeats)
    load_after = os.getloadavg()[0]

    import transformers

    print(f"decoder: vocab {VOCAB}, d_model {D_MODEL}, {LAYERS} layers, {HEADS} heads, "
          f"{KV_HEADS} KV heads; prompt {PROMPT}, {NEW} new tokens; {args.threads} threads; "
          f"torch {torch.__version__}, transformers {transformers.__version__}; "
          f"medians of {args.repeats} runs ({PREFILLS_PER_RUN} prefills each); "
          f"load average {load_before:.2f} before, {load_after:.2f} after "
          f"({os.cpu_count()} CPUs)")
    print()
    print("| measurement | " + " | ".join(NAMES)
          + " | ours sdpa / HF sdpa | ours eager / HF eager |")
    print("|---" * (len(NAMES) + 3) + "|")
    rows = (("prefill, 256 tokens (ms)", "prefill"), ("decode, per token (ms)", "decode"))
    for label, key in rows:
        ms = {name: t[name][key] * 1e3 for name in NAMES}
        print(f"| {label} | " + " | ".join(f"{ms[name]:.2f}" for name in NAMES)
              + f" | {ms['ours sdpa'] / ms['HF sdpa']:.2f}x"
              + f" | {ms['ours eager'] / ms['HF eager']:.2f}x |")
    print()
    print("| generation of 128 tokens after 256 (s) | with KV cache | recomputing the prefix "
          "| speed-up |")
    print("|---|---|---|---|")
    print(f"| ours (eager) | {cached_s:.3f} | {recomputed_s:.3f} | "
          f"{recomputed_s / cached_s:.1f}x |")


if __name__ == "__main__":
    main()
