"""Chapter 7's checkers (``transformer_lib/checks/ch07_kv_cache.py``) name the usual mistakes
in words a student can act on. The contract every checker keeps is in
``test_checks_contract.py``."""
from __future__ import annotations

import torch

from transformer_lib.attention import causal_mask, repeat_kv, scaled_dot_product_attention
from transformer_lib.checks import (
    ch07_kv_cache,
    check_batched_generation,
    check_cached_attention_step,
    check_max_context,
    check_speculative_step,
)
from transformer_lib.positional import apply_rope

from chapter_solutions import references
from conftest import mistake_tests

cached_attention_step, max_context, speculative_step, generate_batch = references(
    "07_kv_cache", "cached_attention_step", "max_context", "speculative_step", "generate_batch")


def context_with(*, factor=2, use_n_heads=False, batch=True, bits=False, float_division=False):
    """max_context with one of the usual mistakes."""

    def context(budget_bytes, n_layers, d_model, n_heads, n_kv_heads, batch_size, dtype):
        head_dim = d_model // n_heads
        size = dtype.itemsize * (8 if bits else 1)
        heads = n_heads if use_n_heads else n_kv_heads
        per_position = factor * n_layers * heads * head_dim * size * (batch_size if batch else 1)
        return budget_bytes / per_position if float_division else budget_bytes // per_position

    return context


def step_with(*, mask="causal", rope_from_zero=False, store_repeated=False, rotate_v=False):
    """cached_attention_step with one of the usual mistakes."""

    def step(attn, x, k_cache, v_cache, cos, sin):
        B, T, C = x.shape
        P, H, H_kv, D = k_cache.shape[2], attn.n_heads, attn.n_kv_heads, attn.head_dim
        start = 0 if rope_from_zero else P
        rows = cos[start:start + T], sin[start:start + T]
        q = apply_rope(attn.q_proj(x).view(B, T, H, D).transpose(1, 2), *rows)
        k = apply_rope(attn.k_proj(x).view(B, T, H_kv, D).transpose(1, 2), *rows)
        v = attn.v_proj(x).view(B, T, H_kv, D).transpose(1, 2)
        if rotate_v:
            v = apply_rope(v, *rows)
        keys, values = torch.cat([k_cache, k], dim=2), torch.cat([v_cache, v], dim=2)
        m = {"causal": causal_mask(T, P + T), "square": causal_mask(T),
             "tril": torch.tril(torch.ones(T, P + T, dtype=torch.bool)), "none": None}[mask]
        keys_h, values_h = repeat_kv(keys, attn.n_rep), repeat_kv(values, attn.n_rep)
        out, _ = scaled_dot_product_attention(q, keys_h, values_h, m)
        out = attn.o_proj(out.transpose(1, 2).reshape(B, T, C))
        return (out, keys_h, values_h) if store_repeated else (out, keys, values)

    return step


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
    (check_cached_attention_step, step_with(mask="tril"),
     ["1 of 4 checks passed", "wrong values in out", "the mask ignores the offset"]),
    (check_cached_attention_step, step_with(mask="square"),
     ["does not broadcast to scores", "a square (T, T) mask leaves out the cached keys"]),
    (check_cached_attention_step, step_with(mask="none"),
     ["1 of 4 checks passed", "within the chunk the mask is still causal"]),
    (check_cached_attention_step, step_with(rope_from_zero=True),
     ["1 of 4 checks passed", "as if they started at position 0"]),
    (check_cached_attention_step, step_with(store_repeated=True),
     ["wrong shape for k_cache", "store the H_kv key/value heads"]),
    (check_cached_attention_step, step_with(rotate_v=True), ["the values were rotated"]),
    (check_cached_attention_step, lambda *args: cached_attention_step(*args)[0],
     ["return the triple (out, k_cache, v_cache)"]),
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


def test_the_reference_step_equals_the_layer_on_the_whole_sequence():
    """The checker's reference is the library's layer: a full causal forward over cached and
    new positions gives the same output for the new ones."""
    from transformer_lib.attention import MultiHeadAttention
    from transformer_lib.positional import rope_cos_sin

    attn = MultiHeadAttention(16, 4, 2, bias=False).eval()
    x = torch.randn(2, 8, 16)
    cos, sin = rope_cos_sin(8, 4)
    with torch.no_grad():
        full = attn(x, mask=causal_mask(8), rope=(cos, sin))
        k = apply_rope(attn.k_proj(x[:, :5]).view(2, 5, 2, 4).transpose(1, 2), cos[:5], sin[:5])
        v = attn.v_proj(x[:, :5]).view(2, 5, 2, 4).transpose(1, 2)
        out, _, _ = ch07_kv_cache._reference_step(attn, x[:, 5:], k, v, cos, sin)
    torch.testing.assert_close(out, full[:, 5:], atol=1e-6, rtol=0)


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
