"""Chapter 7's checkers (``transformer_lib/checks/ch07_kv_cache.py``, and for the core the
learner writes, ``ch07_cached_attention.py`` and ``ch07_sampling.py``) name the usual mistakes
in words a student can act on. The contract every checker keeps is in
``test_checks_contract.py``."""
from __future__ import annotations

import torch

from transformer_lib.attention import MultiHeadAttention, causal_mask
from transformer_lib.checks import (
    ch07_cached_attention,
    ch07_kv_cache,
    ch07_sampling,
    check_batched_generation,
    check_cached_forward,
    check_max_context,
    check_sampling_probs,
    check_speculative_step,
    check_write_kv,
)
from transformer_lib.positional import apply_rope, rope_cos_sin
from transformer_lib.sampling import next_token_probs

from chapter_solutions import references
from conftest import mistake_tests

max_context, speculative_step, generate_batch = references(
    "07_kv_cache", "max_context", "speculative_step", "generate_batch")


def context_with(*, factor=2, use_n_heads=False, batch=True, bits=False, float_division=False):
    """max_context with one of the usual mistakes."""

    def context(budget_bytes, n_layers, d_model, n_heads, n_kv_heads, batch_size, dtype):
        head_dim = d_model // n_heads
        size = dtype.itemsize * (8 if bits else 1)
        heads = n_heads if use_n_heads else n_kv_heads
        per_position = factor * n_layers * heads * head_dim * size * (batch_size if batch else 1)
        return budget_bytes / per_position if float_division else budget_bytes // per_position

    return context


def speculative_with(*, rollback="accepted", shift=False, every_match=False, bonus=True,
                     one_by_one=False):
    """speculative_step with one of the usual mistakes."""

    def step(model, cache, pending, draft):
        start, k = cache.pos, draft.shape[1]
        chunk = torch.cat([pending, draft], dim=1)  # (1, k + 1)
        if one_by_one:  # the right tokens, from k + 1 forward passes
            logits = torch.cat([model(chunk[:, i:i + 1], cache) for i in range(k + 1)], dim=1)
        else:
            logits = model(chunk, cache)
        choice = logits.argmax(-1)  # (1, k + 1)
        if shift:
            choice = choice[:, 1:]
        agree = [bool(draft[0, i] == choice[0, i]) for i in range(min(k, choice.shape[1]))]
        n = sum(agree) if every_match else next((i for i, a in enumerate(agree) if not a),
                                                len(agree))
        cache.pos = {"accepted": start + 1 + n, "none": start + 1 + k, "pending": start + n}[
            rollback]
        new = torch.cat([draft[:, :n], choice[:, n:n + 1]], dim=1)
        return new if bonus else draft[:, :n]

    return step


def batch_with(*, mask="every", side="left", one_at_a_time=False, library=False):
    """generate_batch with one of the usual mistakes, written independently of the checker."""

    def generate(model, prompts, n):
        if one_at_a_time:  # right tokens, one batch per prompt
            alone = batch_with(mask=mask, side=side)
            return torch.cat([alone(model, [p], n) for p in prompts])
        B, L = len(prompts), max(len(p) for p in prompts)
        tokens = torch.zeros(B, L, dtype=torch.long)
        real = torch.ones(B, L + n, dtype=torch.bool)
        for b, p in enumerate(prompts):
            if side == "left":
                tokens[b, L - len(p):], real[b, :L - len(p)] = p, False
            else:
                tokens[b, :len(p)], real[b, len(p):L] = p, False
        if library:  # the library's generate on the padded batch: no key mask
            return model.generate(tokens, n)[:, L:]
        cache, out = model.new_cache(B, L + n), []
        for step in range(n):
            T, P = tokens.shape[1], cache.pos
            rope = (model.rope_cos[P:P + T], model.rope_sin[P:P + T])
            use = mask == "every" or (mask == "prefill" and step == 0)
            x = model.embed_tokens(tokens)
            for layer in model.layers:
                x = layer(x, rope, cache, mask=real[:, None, None, :P + T] if use else None)
            cache.advance(T)
            tokens = model.lm_head(model.norm(x[:, -1:])).argmax(-1)
            out.append(tokens)
        return torch.cat(out, dim=1)

    return generate


def recompute_batch(model, prompts, n):
    """The right tokens from one batch, but every step runs the whole padded sequence."""
    L = max(len(p) for p in prompts)
    tokens = torch.stack([torch.cat([torch.zeros(L - len(p), dtype=torch.long), p])
                          for p in prompts])
    real = torch.stack([torch.arange(L) >= L - len(p) for p in prompts])
    for _ in range(n):
        T = tokens.shape[1]
        visible = real[:, None, None, :] & causal_mask(T)
        x = model.embed_tokens(tokens)
        for layer in model.layers:
            x = layer(x, (model.rope_cos[:T], model.rope_sin[:T]), None, causal=False,
                      mask=visible)
        tokens = torch.cat([tokens, model.lm_head(model.norm(x[:, -1:])).argmax(-1)], dim=1)
        real = torch.cat([real, torch.ones(len(prompts), 1, dtype=torch.bool)], dim=1)
    return tokens[:, L:]


WRONG = [
    # (checker, wrong solution, fragments that the verdict must contain)
    (check_max_context, context_with(use_n_heads=True),
     ["2 of 4 checks passed", "wrong value for the context length: expected 49152, got 12288",
      "only the n_kv_heads heads"]),
    (check_max_context, context_with(factor=1), ["keys and values: two tensors per layer"]),
    (check_max_context, context_with(batch=False), ["grow with the batch"]),
    (check_max_context, context_with(bits=True), ["this counts bits"]),
    (check_max_context, context_with(float_division=True),
     ["not a whole number of positions", "round down"]),
    (check_max_context, lambda *args: max_context(*args) + 1,
     ["0 of 4 checks passed", "expected 0, got 1", "this rounds up"]),
    (check_speculative_step, speculative_with(rollback="none"),
     ["cache.pos is", "set it back to P + 1 + n"]),
    (check_speculative_step, speculative_with(rollback="pending"),
     ["the pending token was dropped from the cache"]),
    (check_speculative_step, speculative_with(shift=True),
     ["the logits of the chunk's position i predict the token after position i"]),
    (check_speculative_step, speculative_with(every_match=True),
     ["2 of 4 checks passed", "expected (1, n + 1) = (1, 3), got (1, 4)",
      "a draft token after the first disagreement was accepted"]),
    (check_speculative_step, speculative_with(bonus=False),
     ["wrong shape for the new tokens", "the step returns n + 1 tokens"]),
    (check_speculative_step, speculative_with(one_by_one=True),
     ["0 of 4 checks passed", "the step ran the model 5 times",
      "verify the whole draft in one forward pass"]),
    (check_batched_generation, batch_with(mask="none"),
     ["2 of 4 checks passed", "wrong values in the new tokens",
      "the padding tokens were attended"]),
    (check_batched_generation, batch_with(library=True),
     ["0 of 4 checks passed", "Decoder.generate` is not allowed here"]),
    (check_batched_generation, batch_with(mask="prefill"),
     ["the padded keys were blocked in the prefill only"]),
    (check_batched_generation, batch_with(side="right"), ["pad on the left"]),
    (check_batched_generation, batch_with(one_at_a_time=True),
     ["1 of 4 checks passed", "a forward pass carried 1 sequence(s), not all 2",
      "put every prompt in one batch"]),
    (check_batched_generation, recompute_batch,
     ["forward passes fed chunks of", "feed only the newest token of each sequence"]),
]


def test_speculative_reference_matches_greedy_decoding():
    model = ch07_kv_cache._checker_model(seed=7)
    prompt = torch.randint(0, 16, (1, 6))
    with torch.no_grad():
        truth = model.generate(prompt, 6)[:, 6:]
        cache = model.new_cache(1)
        model(prompt[:, :-1], cache)
        new = speculative_step(model, cache, prompt[:, -1:], truth[:, :4])
    assert torch.equal(new, truth[:, :5]) and cache.pos == 5 + 1 + 4


test_wrong_solution_is_rejected_with_the_reason, test_every_checker_knows_at_least_two_mistakes = (
    mistake_tests(WRONG, ch07_kv_cache))


def test_batched_reference_matches_each_prompt_alone():
    """The chapter's solution, and the checker's reference, give each prompt's own greedy tokens,
    in one prefill and one single-token forward per new token over the whole batch."""
    model = ch07_kv_cache._checker_model(seed=11).double()
    prompts = [torch.randint(0, 16, (n,)) for n in (2, 9, 5)]
    with torch.no_grad(), ch07_kv_cache.count_forwards(model) as chunks:
        got = generate_batch(model, prompts, 7)
    with torch.no_grad():
        alone = torch.cat([model.generate(p[None], 7)[:, len(p):] for p in prompts])
        assert torch.equal(ch07_kv_cache.batched_reference(model, prompts, 7), alone)
    assert torch.equal(got, alone)
    assert chunks == [(3, 9)] + [(3, 1)] * 6


def test_the_forward_counter_sees_every_pass_and_lets_go():
    model = ch07_kv_cache._checker_model(seed=7)
    with torch.no_grad():
        with ch07_kv_cache.count_forwards(model) as chunks:
            cache = model.new_cache(2)
            model(torch.zeros(2, 4, dtype=torch.long), cache)
            model(torch.zeros(2, 1, dtype=torch.long), cache)
        model(torch.zeros(1, 3, dtype=torch.long))
    assert chunks == [(2, 4), (2, 1)]


# The core the chapter builds: the write into a preallocated cache, a cached attention step ---

write_kv, cached_forward, sampling_probs = references(
    "07_kv_cache", "write_kv", "cached_forward", "sampling_probs")


def write_with(*, shift=0, to_end=False, copy=False, returns="prefix", strict=False,
               check=True):
    """write_kv with one of the usual mistakes."""

    def write(k_cache, v_cache, k_new, v_new, position):
        T, S_max = k_new.shape[2], k_cache.shape[2]
        start = position + shift
        end = start + T
        if check and (end >= S_max if strict else end > S_max):
            raise ValueError(f"{position} + {T} > {S_max}")
        if copy:  # a new tensor: the caller's cache stays as it was
            k_cache, v_cache = k_cache.clone(), v_cache.clone()
        if to_end:  # one new position broadcast into every later slot
            k_cache[:, :, start:], v_cache[:, :, start:] = k_new, v_new
        else:
            k_cache[:, :, start:end], v_cache[:, :, start:end] = k_new, v_new
        if returns == "whole":
            return k_cache, v_cache
        if returns == "new":
            return k_new, v_new
        if returns == "copies":
            return k_cache[:, :, :end].clone(), v_cache[:, :, :end].clone()
        return k_cache[:, :, :end], v_cache[:, :, :end]

    return write


def forward_with(*, rope_from_zero=False, shift=0, raw=False, heads="interleave",
                 mask="causal", scale="head", every_slot=False):
    """cached_forward with one of the usual mistakes, on the chapter's write_kv."""

    def forward(attn, x, k_cache, v_cache, position, cos, sin):
        B, T, C = x.shape
        H, H_kv, D = attn.n_heads, attn.n_kv_heads, attn.head_dim
        first = 0 if rope_from_zero else position
        rows = cos[first:first + T], sin[first:first + T]
        q = apply_rope(attn.q_proj(x).view(B, T, H, D).transpose(1, 2), *rows)
        k = attn.k_proj(x).view(B, T, H_kv, D).transpose(1, 2)
        k = k if raw else apply_rope(k, *rows)
        v = attn.v_proj(x).view(B, T, H_kv, D).transpose(1, 2)
        keys, values = write_kv(k_cache, v_cache, k, v, position + shift)
        if every_slot:
            keys, values = k_cache, v_cache
        S, rep = keys.shape[2], H // H_kv
        if heads == "interleave":
            keys, values = keys.repeat_interleave(rep, 1), values.repeat_interleave(rep, 1)
        elif heads == "tile":
            keys, values = keys.repeat(1, rep, 1, 1), values.repeat(1, rep, 1, 1)
        factor = {"head": D ** -0.5, "none": 1.0, "model": C ** -0.5}[scale]
        scores = q @ keys.transpose(-2, -1) * factor
        visible = {"causal": causal_mask(T, S), "square": causal_mask(T), "none": None,
                   "tril": torch.ones(T, S, dtype=torch.bool).tril()}[mask]
        if visible is not None:
            scores = scores.masked_fill(~visible, float("-inf"))
        out = scores.softmax(-1) @ values
        return attn.o_proj(out.transpose(1, 2).reshape(B, T, C))

    return forward


CORE_WRONG = [
    (check_write_kv, write_with(shift=1),
     ["1 of 5 checks passed", "expected (B, H_kv, position + T, D) = (2, 2, 3, 4), got (2, 2, 4, 4)",
      "one slot too many"]),
    (check_write_kv, write_with(to_end=True),
     ["wrong values in k_cache after the call at batch 0, KV head 0, slot 6",
      "a slice with no end fills every later slot"]),
    (check_write_kv, write_with(copy=True),
     ["1 of 5 checks passed", "k_cache is unchanged after the call",
      "write into the caller's cache, in place"]),
    (check_write_kv, lambda k_cache, v_cache, k_new, v_new, position: (
        torch.cat([k_cache[:, :, :position], k_new], dim=2),
        torch.cat([v_cache[:, :, :position], v_new], dim=2)),
     ["0 of 5 checks passed", "k_cache is unchanged after the call"]),
    (check_write_kv, write_with(returns="whole"),
     ["2 of 5 checks passed", "not the whole preallocated cache"]),
    (check_write_kv, write_with(returns="copies"),
     ["keys is a copy, not a view of the cache", "return slices of the cache"]),
    (check_write_kv, write_with(strict=True),
     ["3 of 5 checks passed", "the last slot still fits"]),
    (check_write_kv, write_with(check=False),
     ["4 of 5 checks passed", "instead of a ValueError",
      "9 cached + 4 new positions do not fit in 11 slots"]),
    (check_cached_forward, forward_with(rope_from_zero=True),
     ["1 of 4 checks passed", "wrong values in k_cache after the call",
      "turned as if they stood at position 0"]),
    (check_cached_forward, forward_with(shift=1),
     ["0 of 4 checks passed", "slot 5", "the new keys and values went to the wrong slots"]),
    (check_cached_forward, forward_with(raw=True), ["the cache holds the keys without RoPE"]),
    (check_cached_forward, forward_with(heads="tile"),
     ["2 of 4 checks passed", "wrong values in out", "repeated in the wrong order",
      "(kv0, kv1, kv0, kv1)"]),
    (check_cached_forward, forward_with(heads="none"),
     ["2 of 4 checks passed", "at non-singleton dimension 1",
      "the 4 query heads read 2 key/value heads: repeat each key/value head"]),
    (check_cached_forward, forward_with(mask="tril"),
     ["1 of 4 checks passed", "the mask hides the cached prefix"]),
    (check_cached_forward, forward_with(mask="square"),
     ["3 of 4 checks passed", "a square (T, T) mask leaves out the cached keys"]),
    (check_cached_forward, forward_with(mask="none"),
     ["1 of 4 checks passed", "within the chunk the mask is still causal"]),
    (check_cached_forward, forward_with(scale="none"),
     ["0 of 4 checks passed", "divide the scores by √D = √4"]),
    (check_cached_forward, forward_with(scale="model"),
     ["not the model width C = 16"]),
    (check_cached_forward, forward_with(every_slot=True),
     ["0 of 4 checks passed", "the attention read every slot of the cache"]),
    (check_cached_forward, lambda *args: (cached_forward(*args), None),
     ["out should be a tensor, got a tuple of 2 items"]),
]

test_core_mistake_is_rejected_with_the_reason, test_every_core_checker_knows_two_mistakes = (
    mistake_tests(CORE_WRONG, ch07_cached_attention))


def test_the_reference_step_equals_the_layer_on_the_whole_sequence():
    """The checker's reference, written from the weights, is the library's layer: one causal
    forward pass over the cached and the new positions gives the new ones the same output."""
    torch.manual_seed(0)
    attn = MultiHeadAttention(24, 6, 2, bias=True).eval()
    x = torch.randn(2, 9, 24)
    cos, sin = rope_cos_sin(9, 4)
    with torch.no_grad():
        full = attn(x, rope=(cos, sin), causal=True)  # (2, 9, 24)
        k, v = ch07_cached_attention._keys_of(attn, x[:, :6], 0)  # positions 0 … 5
        k_cache, v_cache = torch.randn(2, 2, 11, 4), torch.randn(2, 2, 11, 4)  # stale slots
        k_cache[:, :, :6], v_cache[:, :, :6] = k.float(), v.float()
        out, keys, values = ch07_cached_attention._cached_step(attn, x[:, 6:], k_cache,
                                                               v_cache, 6)
        k_all, v_all = ch07_cached_attention._keys_of(attn, x, 0)
    torch.testing.assert_close(out, full[:, 6:], atol=1e-5, rtol=0)
    torch.testing.assert_close(keys[:, :, :9], k_all.float(), atol=1e-5, rtol=0)
    torch.testing.assert_close(values[:, :, :9], v_all.float(), atol=1e-5, rtol=0)
    assert torch.equal(keys[:, :, 9:], k_cache[:, :, 9:])  # the stale slots untouched


def test_the_chapters_write_returns_views_of_the_cache():
    k_cache, v_cache = torch.zeros(2, 3, 8, 4), torch.zeros(2, 3, 8, 4)
    keys, values = write_kv(k_cache, v_cache, torch.ones(2, 3, 2, 4), torch.ones(2, 3, 2, 4), 5)
    assert keys.shape == (2, 3, 7, 4) and keys.data_ptr() == k_cache.data_ptr()
    assert k_cache[:, :, 5:7].eq(1).all() and k_cache[:, :, :5].eq(0).all()
    assert k_cache[:, :, 7:].eq(0).all()


# The distribution a sampler draws from ------------------------------------------------------


def sampling_with(*, after_softmax=False, inclusive=False, p_first=False, tied_k=False,
                  by_topk=False, axis=-1, greedy_zero=True, check=True):
    """sampling_probs with one of the usual mistakes."""

    def probs_of(logits, temperature=1.0, top_k=None, top_p=None):
        V = logits.shape[-1]
        if check and (temperature < 0 or (top_k is not None and top_k > V)):
            raise ValueError(f"temperature {temperature}, top_k {top_k}, V = {V}")
        if temperature == 0 and greedy_zero:
            return torch.zeros_like(logits).scatter(-1, logits.argmax(-1, keepdim=True), 1.0)
        probs = (torch.softmax(logits, -1) / temperature if after_softmax
                 else torch.softmax(logits / temperature, -1))

        def cut_k(keep):
            if top_k is None:
                return keep
            if tied_k:  # every token as likely as the k-th
                return keep & (probs >= probs.topk(top_k, -1).values[:, -1:])
            if by_topk:  # whichever of equal values torch.topk returns
                return keep & torch.zeros_like(keep).scatter(-1, probs.topk(top_k, -1).indices,
                                                             True)
            order = torch.sort(probs, dim=-1, descending=True, stable=True).indices
            ranks = torch.empty_like(order).scatter(-1, order, torch.arange(V).expand_as(order))
            return keep & (ranks < top_k)

        def cut_p(keep):
            if top_p is None:
                return keep
            kept = probs * keep / (probs * keep).sum(-1, keepdim=True)
            ranked, order = torch.sort(kept, dim=-1, descending=True, stable=True)
            cum = ranked.cumsum(-1)
            ok = cum <= top_p if inclusive else cum - ranked < top_p
            return keep & torch.zeros_like(keep).scatter(-1, order, ok)

        keep = torch.ones_like(probs, dtype=torch.bool)
        keep = cut_k(cut_p(keep)) if p_first else cut_p(cut_k(keep))
        kept = probs * keep
        return kept / kept.sum(axis, keepdim=True)

    return probs_of


SAMPLING_WRONG = [
    (check_sampling_probs, sampling_with(after_softmax=True),
     ["6 of 9 checks passed", "the temperature changed nothing",
      "divide the logits by τ before the softmax"]),
    (check_sampling_probs, sampling_with(inclusive=True),
     ["5 of 9 checks passed", "top-p kept one token too few",
      "includes the token that crosses p", "NaN appeared in the probabilities"]),
    (check_sampling_probs, sampling_with(p_first=True),
     ["7 of 9 checks passed", "top-p ran before top-k"]),
    (check_sampling_probs, sampling_with(tied_k=True),
     ["8 of 9 checks passed", "top-k kept every token tied with the k-th"]),
    (check_sampling_probs, sampling_with(by_topk=True),
     ["8 of 9 checks passed", "torch.topk does not promise which of equal values it returns"]),
    (check_sampling_probs, sampling_with(axis=0),
     ["row 0 of the probabilities sums to", "renormalised over the wrong axis"]),
    (check_sampling_probs, sampling_with(greedy_zero=False),
     ["8 of 9 checks passed", "NaN appeared in the probabilities",
      "0 means greedy"]),
    (check_sampling_probs, sampling_with(check=False),
     ["7 of 9 checks passed", "instead of raising a ValueError (a temperature must be >= 0)",
      "instead of raising a ValueError (top_k must be at most V)"]),
    (check_sampling_probs,
     lambda logits, t, k, p: sampling_probs(logits, t, k, p).flip(-1),
     ["wrong values in the probabilities"]),
]

test_sampling_mistake_is_rejected_with_the_reason, test_the_sampling_checker_knows_two_mistakes = (
    mistake_tests(SAMPLING_WRONG, ch07_sampling))


def test_the_sampling_reference_agrees_with_the_library():
    """The checker's reference, which ranks by counting, and the library's sampler, which
    sorts, give the same distribution: a second opinion on the rules, ties included."""
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(6, 40, generator=g, dtype=torch.float64) * 2
    logits[:, 7] = logits[:, 3]  # ties
    for temperature, top_k, top_p in [(0.5, None, None), (1.0, 7, None), (1.2, None, 0.8),
                                      (0.9, 12, 0.6), (0.0, 3, 0.5)]:
        want = next_token_probs(logits, temperature=temperature, top_k=top_k, top_p=top_p)
        got = ch07_sampling._sampling(logits, temperature, top_k, top_p)
        torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
        torch.testing.assert_close(sampling_probs(logits, temperature, top_k, top_p), want,
                                   atol=1e-12, rtol=0)
