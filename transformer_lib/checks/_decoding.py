"""Decoding machinery of chapter 7's checkers (``ch07_kv_cache``): a small decoder whose greedy
choices vary, greedy speculative decoding and its known mistakes, a counter of forward passes,
and greedy generation of a left-padded batch with one KV cache, with its known mistakes."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator, Sequence

import torch
from torch import Tensor

from transformer_lib.cache import KVCache
from transformer_lib.checks._harness import _call, _Failure
from transformer_lib.decoder import Decoder, DecoderConfig


@contextmanager
def count_forwards(model: Decoder) -> Iterator[list[tuple[int, int]]]:
    """Within the block, every call of the model's first layer (any forward pass, written
    out or not) appends its ``(batch, new tokens)`` to the list it yields."""
    calls: list[tuple[int, int]] = []
    handle = model.layers[0].register_forward_pre_hook(
        lambda module, args: calls.append(tuple(args[0].shape[:2])))
    try:
        yield calls
    finally:
        handle.remove()


def _checker_model(seed: int) -> Decoder:
    """A small decoder whose greedy choices vary from token to token (16 tokens, weights drawn
    wide), made without touching the global random state."""
    config = DecoderConfig(vocab_size=16, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                           d_ff=48, max_seq_len=64)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Decoder(config)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" in name:
                    p.uniform_(0.7, 1.3)
                else:
                    p.normal_(0.0, 0.3)
    return model.eval()


def _greedy(model: Decoder, tokens: Tensor, n: int) -> Tensor:
    """The n greedy tokens that follow ``tokens`` ``(1, T)``: ``(1, n)``."""
    return model.generate(tokens, n, use_cache=False)[:, tokens.shape[1]:]


def _speculative_reference(model: Decoder, cache: KVCache, pending: Tensor, draft: Tensor, *,
                           rollback: str = "accepted", shift: int = 0, prefix: bool = True,
                           bonus: bool = True) -> Tensor:
    """The reference (the defaults) and the mistakes (the other arguments)."""
    P, k = cache.pos, draft.shape[1]
    logits = model(torch.cat([pending, draft], dim=1), cache)  # (1, k + 1, V)
    choice = logits.argmax(dim=-1)  # (1, k + 1): the model's token after each position
    if shift:
        choice = torch.cat([choice[:, 1:], choice[:, -1:]], dim=1)
    agree = (draft[0] == choice[0, :k]).long()
    n = int(agree.cumprod(0).sum()) if prefix else int(agree.sum())
    cache.pos = {"accepted": P + 1 + n, "none": P + 1 + k, "pending": P + n}[rollback]
    new = torch.cat([draft[:, :n], choice[:, n:n + 1]], dim=1)  # (1, n + 1)
    return new if bonus else draft[:, :n]


def _run_spec(step: Callable, model: Decoder, prompt: Tensor, draft: Tensor, copy: bool
              ) -> tuple[object, KVCache, Tensor, Tensor]:
    """Prefill ``prompt[:, :-1]`` into a fresh cache, then call ``step`` once."""
    cache = model.new_cache(1)
    with torch.no_grad():
        model(prompt[:, :-1], cache)
    pending = prompt[:, -1:]
    if copy:
        with count_forwards(model) as chunks:
            new = _call(step, [model, cache, pending, draft],
                        ["model", "cache", "pending", "draft"])
        if len(chunks) != 1:
            raise _Failure(f"the step ran the model {len(chunks)} times, on chunks of "
                           f"{[t for _, t in chunks]} tokens",
                           "verify the whole draft in one forward pass: feed the pending "
                           "token and the k draft tokens as one chunk of k + 1")
        return new, cache, pending, draft
    with torch.no_grad():
        return step(model, cache, pending, draft), cache, pending, draft


def _spec_mistakes(model: Decoder, prompt: Tensor, draft: Tensor) -> list[tuple[Tensor, int, str]]:
    """(new tokens, cache.pos after) of each known mistake, with its hint."""
    found = []
    for kwargs, hint in [
        (dict(shift=1), "the logits of the chunk's position i predict the token after "
                        "position i: draft token i is checked against the choice made at "
                        "the chunk's position i (the pending token is position 0)"),
        (dict(prefix=False), "a draft token after the first disagreement was accepted: once "
                             "the model disagrees, the later draft tokens were guessed after "
                             "a wrong token and are all rejected"),
        (dict(bonus=False), "after the accepted draft tokens comes the model's own token, the "
                            "choice at the first rejected position (or after the last draft "
                            "token): the step returns n + 1 tokens"),
        (dict(rollback="none"), "cache.pos still counts the rejected draft tokens: set it back "
                                "to P + 1 + n, so that their stale keys and values are "
                                "neither read nor kept"),
        (dict(rollback="pending"), "the pending token was dropped from the cache: it was "
                                   "part of the sequence, so cache.pos is P + 1 + n"),
    ]:
        step = lambda m, c, p, d, kw=kwargs: _speculative_reference(m, c, p, d, **kw)  # noqa: E731
        new, cache, _, _ = _run_spec(step, model, prompt, draft, copy=False)
        found.append((new, cache.pos, hint))
    return found


# Greedy generation of a batch of prompts of different lengths ------------------------------


def batched_reference(model: Decoder, prompts: Sequence[Tensor], n: int, *,
                      mask: str = "every", side: str = "left") -> Tensor:
    """The reference (the defaults) and the mistakes: greedy tokens ``(B, n)`` after each
    prompt, all prompts in one batch with one KV cache. ``mask``: ``"every"`` forward,
    ``"prefill"`` only, or ``"none"``; ``side``: where the padding goes (the next token is
    read from the last column either way)."""
    B, L = len(prompts), max(len(p) for p in prompts)
    tokens = torch.zeros(B, L, dtype=torch.long)  # (B, L): padding id 0
    real = torch.ones(B, L + n, dtype=torch.bool)  # (B, L + n): slots holding a real token
    for b, p in enumerate(prompts):
        pad = slice(0, L - len(p)) if side == "left" else slice(len(p), L)
        keep = slice(L - len(p), L) if side == "left" else slice(0, len(p))
        tokens[b, keep], real[b, pad] = p, False
    cache, new = model.new_cache(B, L + n), []
    for step in range(n):
        T, start = tokens.shape[1], cache.pos
        rope = (model.rope_cos[start:start + T], model.rope_sin[start:start + T])  # (T, D/2)
        use = mask == "every" or (mask == "prefill" and step == 0)
        keys = real[:, None, None, :start + T] if use else None  # (B, 1, 1, S)
        x = model.embed_tokens(tokens)  # (B, T, C)
        for layer in model.layers:
            x = layer(x, rope, cache, mask=keys)
        cache.advance(T)
        tokens = model.lm_head(model.norm(x[:, -1:])).argmax(dim=-1)  # (B, 1)
        new.append(tokens)
    return torch.cat(new, dim=1)  # (B, n)


BATCH_MISTAKES = [
    (dict(mask="none"), "the padding tokens were attended: they are keys like any other "
                        "unless a mask over the keys, (B, 1, 1, S), blocks them"),
    (dict(mask="prefill"), "the padded keys were blocked in the prefill only: a decode step "
                           "builds no causal mask, but the padded keys are still in the cache, "
                           "so pass the key mask at every step"),
    (dict(side="right"), "with the padding on the right, the last column is a padding slot for "
                         "the shorter prompts and their new tokens land after a gap: pad on "
                         "the left, so that every prompt ends in the last column"),
]
