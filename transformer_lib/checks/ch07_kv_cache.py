"""Checkers for the exercises at the end of chapter 7, the KV cache
(``chapters/07_kv_cache.ipynb``): the longest context whose cache fits a memory budget, greedy
generation of prompts of different lengths in one batch with one cache, and a step of greedy
speculative decoding that verifies a draft in one forward and rolls the cache back. The core
the chapter builds, the write into a preallocated cache and a cached attention step, is
checked in :mod:`~transformer_lib.checks.ch07_cached_attention`; the sampling distribution in
:mod:`~transformer_lib.checks.ch07_sampling`."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator, Sequence

import torch
from torch import Tensor, nn

from transformer_lib.cache import KVCache
from transformer_lib.checks._guard import Rules, given
from transformer_lib.checks._harness import (
    CheckResult,
    _call,
    _compare,
    _compare_number,
    _describe,
    _Failure,
    _generator,
    _known_mistakes,
    _run,
)
from transformer_lib.checks._messages import say
from transformer_lib.decoder import Decoder, DecoderConfig

#: What the student's code may call in each exercise: exercise function -> its
#: :class:`~transformer_lib.checks.Rules` (enforced by the guard while the function runs).
RULES = {
    "max_context": Rules(),
    "generate_batch": Rules(allow=(
        "Decoder.new_cache", "DecoderBlock", "RMSNorm", "PositionCache.advance", "causal_mask")),
    "speculative_step": Rules(allow=("Decoder.forward",)),
}

# The longest context that fits a budget -----------------------------------------------------


def _bytes_per_value(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _max_context(budget_bytes: int, n_layers: int, d_model: int, n_heads: int,
                 n_kv_heads: int, batch_size: int, dtype: torch.dtype, *, factor: int = 2,
                 heads: int | None = None, batch: bool = True, bits: bool = False,
                 round_up: bool = False) -> int:
    """The reference (the defaults) and the mistakes (the other arguments)."""
    head_dim = d_model // n_heads
    size = dtype.itemsize * 8 if bits else _bytes_per_value(dtype)
    per_token = factor * n_layers * (heads or n_kv_heads) * head_dim * size
    per_token *= batch_size if batch else 1
    return -(-budget_bytes // per_token) if round_up else budget_bytes // per_token


_CONTEXT_MISTAKES = [
    (dict(heads="n_heads"), say("this counts one key/value head per query head: with grouped-query "
                                "attention the cache holds only the n_kv_heads heads")),
    (dict(factor=1), say("the cache holds keys and values: two tensors per layer, not one")),
    (dict(batch=False), say("each of the batch_size sequences has its own cache: the bytes per "
                            "position grow with the batch")),
    (dict(bits=True), say("this counts bits: a value of this dtype takes "
                          "torch.empty((), dtype=dtype).element_size() bytes")),
    (dict(round_up=True), say("this rounds up, and the last position would not fit: the answer "
                              "is the largest context whose cache stays within the budget")),
    (dict(factor=4), say("keys and values are two tensors per layer: count the factor 2 once")),
]


def check_max_context(max_context: Callable[..., int]) -> CheckResult:
    """Check ``max_context(budget_bytes, n_layers, d_model, n_heads, n_kv_heads, batch_size,
    dtype) -> int``: the largest number of positions T such that the KV cache of
    ``batch_size`` sequences of T positions fits in ``budget_bytes`` bytes, for a decoder
    with head dim ``d_model // n_heads``, values stored in ``dtype``.

    Args:
        max_context: the function to check (the exercise's), called on the checker's own
            inputs.

    Returns:
        A :class:`~transformer_lib.checks.CheckResult`, truthy when every check passed;
        its report is printed.
    """

    def case(*args) -> Callable[[], None]:
        names = ["budget_bytes", "n_layers", "d_model", "n_heads", "n_kv_heads", "batch_size",
                 "dtype"]

        def run() -> None:
            got = _call(max_context, list(args), names)
            want = _max_context(*args)
            if isinstance(got, float) and not got.is_integer():
                raise _Failure(say("returned {got}, not a whole number of positions", got=got),
                               say("round down to a whole number of positions: // rather than /"))
            mistakes = _known_mistakes(_max_context, args, names, _CONTEXT_MISTAKES)
            _compare_number(got, want, say("the context length"), rel_tol=0.0, mistakes=mistakes)
        return run

    gib = 2 ** 30
    return _run("max_context", max_context, [
        (say("24 GiB, a 7B-class shape with 8 KV heads, batch 4, bfloat16"),
         case(24 * gib, 32, 4096, 32, 8, 4, torch.bfloat16)),
        (say("1 GB (10^9 bytes), 12 layers, MHA, batch 1, float32: not a whole number of "
             "positions"), case(10 ** 9, 12, 768, 12, 12, 1, torch.float32)),
        (say("80 GiB, 80 layers with 8 KV heads of 128, batch 16, float16"),
         case(80 * gib, 80, 8192, 64, 8, 16, torch.float16)),
        (say("a budget smaller than one position: 0"), case(200, 2, 64, 4, 1, 1, torch.float64)),
    ], rules=RULES["max_context"])


# A small decoder to decode with, and a counter of its forward passes -------------------------


@contextmanager
def count_forwards(model: Decoder) -> Iterator[list[tuple[int, int]]]:
    """Within the block, every call of the model's first layer (any forward pass, written
    out or not) appends its ``(batch, new tokens)`` to the list it yields."""
    calls: list[tuple[int, int]] = []

    @given
    def record(module: nn.Module, args: tuple) -> None:
        calls.append(tuple(args[0].shape[:2]))

    handle = model.layers[0].register_forward_pre_hook(record)
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


# Prompts of different lengths in one batch -----------------------------------------------------


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


#: The usual mistakes of batched generation: the keyword arguments of
#: :func:`batched_reference` that make each one, and the message it earns.
BATCH_MISTAKES = [
    (dict(mask="none"), say("the padding tokens were attended: they are keys like any other "
                            "unless a mask over the keys, (B, 1, 1, S), blocks them")),
    (dict(mask="prefill"), say("the padded keys were blocked in the prefill only: a decode step "
                               "builds no causal mask, but the padded keys are still in the cache, "
                               "so pass the key mask at every step")),
    (dict(side="right"), say("with the padding on the right, the last column is a padding slot for "
                             "the shorter prompts and their new tokens land after a gap: pad on "
                             "the left, so that every prompt ends in the last column")),
]


def check_batched_generation(generate_batch: Callable[..., Tensor]) -> CheckResult:
    """Check ``generate_batch(model, prompts, max_new_tokens) -> (B, max_new_tokens)``: the
    greedy tokens after each of the B prompts (1-D LongTensors of different lengths) of a
    :class:`~transformer_lib.decoder.Decoder`, as decoding each prompt alone gives them, with
    every prompt in one batch: one prefill and then one forward pass of one token per sequence
    for each new token, all B sequences in each.

    Args:
        generate_batch: the function to check (the exercise's), called on the checker's own
            inputs.

    Returns:
        A :class:`~transformer_lib.checks.CheckResult`, truthy when every check passed;
        its report is printed.
    """
    model = _checker_model(seed=11).double()  # float64: no near-tie flips a greedy choice

    def case(lengths: Sequence[int], n: int) -> Callable[[], None]:
        g = _generator(len(lengths) * 10 + n)
        prompts = [torch.randint(0, 16, (L,), generator=g) for L in lengths]

        def run() -> None:
            with torch.no_grad(), count_forwards(model) as chunks:
                got = _call(generate_batch, [model, list(prompts), n],
                            ["model", "prompts", "max_new_tokens"])
            with torch.no_grad():
                want = torch.cat([_greedy(model, p[None], n) for p in prompts])  # (B, n)
                wrongs = [(batched_reference(model, prompts, n, **kw), hint)
                          for kw, hint in BATCH_MISTAKES]
            _compare(got, want, say("the new tokens"), letters=say("(B, max_new_tokens)"),
                     axes=("prompt", say("new token")), mistakes=wrongs)
            B = len(prompts)
            alone = [b for b, _ in chunks if b != B]
            if alone:
                raise _Failure(say("a forward pass carried {carried} sequence(s), not all {B}",
                                   carried=alone[0], B=B),
                               say("put every prompt in one batch, padded to one length: each "
                                   "forward pass serves all B sequences"))
            if len(chunks) > n or any(t != 1 for _, t in chunks[1:]):
                raise _Failure(say("{passes} forward passes fed chunks of {chunks} tokens for {n} "
                                   "new tokens", passes=len(chunks),
                                   chunks=[t for _, t in chunks], n=n),
                               say("prefill once into a KV cache (model.new_cache(B, ...)), then "
                                   "feed only the newest token of each sequence"))
        return run

    return _run("generate_batch", generate_batch, [
        (say("two prompts of 3 and 7 tokens, 5 new tokens"), case((3, 7), 5)),
        (say("three prompts of 6, 1 and 4 tokens, 6 new tokens"), case((6, 1, 4), 6)),
        (say("two prompts of the same length (nothing padded), 4 new tokens"), case((5, 5), 4)),
        (say("one prompt of 4 tokens, 3 new tokens"), case((4,), 3)),
    ], rules=RULES["generate_batch"])


# Greedy speculative decoding: verify a draft, roll the cache back ------------------------------


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
            raise _Failure(say("the step ran the model {passes} times, on chunks of "
                               "{chunks} tokens", passes=len(chunks),
                               chunks=[t for _, t in chunks]),
                           say("verify the whole draft in one forward pass: feed the pending "
                               "token and the k draft tokens as one chunk of k + 1"))
        return new, cache, pending, draft
    with torch.no_grad():
        return step(model, cache, pending, draft), cache, pending, draft


def _spec_mistakes(model: Decoder, prompt: Tensor, draft: Tensor) -> list[tuple[Tensor, int, str]]:
    """(new tokens, cache.pos after) of each known mistake, with its hint."""
    found = []
    for kwargs, hint in [
        (dict(shift=1), say("the logits of the chunk's position i predict the token after "
                            "position i: draft token i is checked against the choice made at "
                            "the chunk's position i (the pending token is position 0)")),
        (dict(prefix=False), say("a draft token after the first disagreement was accepted: once "
                                 "the model disagrees, the later draft tokens were guessed after "
                                 "a wrong token and are all rejected")),
        (dict(bonus=False), say("after the accepted draft tokens comes the model's own token, the "
                                "choice at the first rejected position (or after the last draft "
                                "token): the step returns n + 1 tokens")),
        (dict(rollback="none"), say("cache.pos still counts the rejected draft tokens: set it back "
                                    "to P + 1 + n, so that their stale keys and values are "
                                    "neither read nor kept")),
        (dict(rollback="pending"), say("the pending token was dropped from the cache: it was "
                                       "part of the sequence, so cache.pos is P + 1 + n")),
    ]:
        step = lambda m, c, p, d, kw=kwargs: _speculative_reference(m, c, p, d, **kw)  # noqa: E731
        new, cache, _, _ = _run_spec(step, model, prompt, draft, copy=False)
        found.append((new, cache.pos, hint))
    return found


def check_speculative_step(speculative_step: Callable[..., Tensor]) -> CheckResult:
    """Check ``speculative_step(model, cache, pending, draft) -> new``: one step of greedy
    speculative decoding with a :class:`~transformer_lib.decoder.Decoder` and its KV cache,
    batch 1. ``cache`` holds positions ``0 … P - 1``; ``pending`` ``(1, 1)`` is the last
    token of the sequence, at position P, not yet cached; ``draft`` ``(1, k)`` are guesses of
    the next k tokens. ``new`` ``(1, n + 1)`` holds the n draft tokens the model agrees with
    (the longest agreeing prefix) and then the model's own greedy token; afterwards
    ``cache.pos`` is ``P + 1 + n``.

    Args:
        speculative_step: the function to check (the exercise's), called on the checker's own
            inputs.

    Returns:
        A :class:`~transformer_lib.checks.CheckResult`, truthy when every check passed;
        its report is printed.
    """
    model = _checker_model(seed=7)
    prompt = torch.randint(0, 16, (1, 6), generator=_generator(3))  # (1, 6)

    def one_step(wrong_at: int | None, k: int, also_right_after: bool = False
                 ) -> Callable[[], None]:
        """A draft of k tokens that agrees with the model up to ``wrong_at`` (None: all)."""
        with torch.no_grad():
            truth = _greedy(model, prompt, k)  # (1, k)
            draft = truth.clone()
            if wrong_at is not None:
                draft[0, wrong_at] = (truth[0, wrong_at] + 1) % 16
                if also_right_after and wrong_at + 1 < k:  # agrees again after the mistake
                    seen = torch.cat([prompt, draft[:, :wrong_at + 1]], dim=1)
                    draft[0, wrong_at + 1] = _greedy(model, seen, 1)[0, 0]
        n = k if wrong_at is None else wrong_at

        def run() -> None:
            with torch.no_grad():
                got, cache, pending, _ = _run_spec(speculative_step, model, prompt, draft,
                                                   copy=True)
                want = torch.cat([truth[:, :n], _greedy(model, torch.cat(
                    [prompt, truth[:, :n]], dim=1), 1)], dim=1)  # (1, n + 1)
                mistakes = _spec_mistakes(model, prompt, draft)
            P = prompt.shape[1] - 1
            shape_hints: dict[tuple[int, ...], str] = {}
            for new, _, hint in mistakes:  # a mistake that accepts too few or too many
                if new.shape != want.shape:
                    shape_hints.setdefault(tuple(new.shape), hint)
            _compare(got, want, say("the new tokens"), letters=say("(1, n + 1)"),
                     axes=("batch", "token"),
                     mistakes=[(new, hint) for new, _, hint in mistakes],
                     shape_hints=shape_hints)
            if cache.pos != P + 1 + n:
                hint = next((h for new, pos, h in mistakes
                             if pos == cache.pos and torch.equal(new, want)), None)
                raise _Failure(say("cache.pos is {pos} after the step; expected P + 1 + n "
                                   "= {P} + 1 + {n} = {expected}", pos=cache.pos, P=P, n=n,
                                   expected=P + 1 + n), hint)
        return run

    def generation(steps: int) -> Callable[[], None]:
        """Generate with the student's step and drafts that are wrong every third token: the
        tokens must be the model's greedy ones, the cache must stay right."""
        def run() -> None:
            with torch.no_grad():
                truth = _greedy(model, prompt, 40)[0]  # (40,)
                cache = model.new_cache(1)
                model(prompt[:, :-1], cache)
                sequence, pending = prompt.clone(), prompt[:, -1:]
                for i in range(steps):
                    done = sequence.shape[1] - prompt.shape[1]
                    draft = truth[done:done + 3].clone()[None]  # (1, 3)
                    if draft.shape[1] < 3:
                        break
                    draft[0, (i % 3)] = (draft[0, i % 3] + 5) % 16  # one wrong guess
                    with count_forwards(model) as chunks:
                        new = _call(speculative_step, [model, cache, pending, draft],
                                    ["model", "cache", "pending", "draft"])
                    if len(chunks) != 1:
                        raise _Failure(say("step {step} ran the model {passes} times",
                                           step=i + 1, passes=len(chunks)),
                                       say("verify the whole draft in one forward pass"))
                    if not isinstance(new, Tensor) or new.dim() != 2 or new.shape[0] != 1 \
                            or new.shape[1] < 1:
                        raise _Failure(say("step {step} returned {got}: return "
                                           "the new tokens as a (1, n + 1) tensor",
                                           step=i + 1, got=_describe(new)))
                    sequence = torch.cat([sequence, new], dim=1)
                    pending = new[:, -1:]
                    if cache.pos != sequence.shape[1] - 1:
                        raise _Failure(
                            say("after step {step} the sequence has {length} tokens "
                                "but cache.pos is {pos} (expected {expected}: "
                                "every token but the pending one)", step=i + 1,
                                length=sequence.shape[1], pos=cache.pos,
                                expected=sequence.shape[1] - 1))
            n = sequence.shape[1] - prompt.shape[1]
            wrong = (sequence[0, prompt.shape[1]:] != truth[:n]).nonzero()
            if len(wrong):
                i = int(wrong[0])
                raise _Failure(say("generated token {i} is {got}, greedy decoding gives {want}",
                                   i=i, got=int(sequence[0, prompt.shape[1] + i]),
                                   want=int(truth[i])))
        return run

    return _run("speculative_step", speculative_step, [
        (say("a draft of 4 the model agrees with: 4 accepted, then the model's token"),
         one_step(None, 4)),
        (say("the first draft token is wrong: nothing accepted, the model's token"),
         one_step(0, 3)),
        (say("the third of 5 draft tokens is wrong and the fourth agrees again: 2 accepted"),
         one_step(2, 5, also_right_after=True)),
        (say("8 steps of generation with a wrong guess in every draft: the greedy tokens"),
         generation(8)),
    ], rules=RULES["speculative_step"])

