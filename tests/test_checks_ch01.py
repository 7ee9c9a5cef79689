"""Chapter 1's checkers (``transformer_lib/checks/ch01_attention.py`` and, for the core the
learner writes, ``ch01_softmax_attention.py``) name the usual mistakes
in words a student can act on. The contract every checker keeps is in
``test_checks_contract.py``."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from transformer_lib.attention import causal_mask, scaled_dot_product_attention
from transformer_lib.checks import (
    ch01_attention,
    ch01_softmax_attention,
    check_attention,
    check_chunked_causal_attention,
    check_left_padded_causal_mask,
    check_masked_softmax,
    check_score_scale,
)

from chapter_solutions import references
from conftest import mistake_tests

chunked_causal_attention, left_padded_causal_mask = references(
    "01_attention", "chunked_causal_attention", "left_padded_causal_mask")

# Plausible wrong masks for a left-padded batch ------------------------------------------------


def _is_real(lengths, S, left=True):
    positions = torch.arange(S)[None, :]  # (1, S)
    return positions >= S - lengths[:, None] if left else positions < lengths[:, None]  # (B, S)


def mask_padded_on_the_right(lengths, T, S):
    return _is_real(lengths, S, left=False)[:, None, None, :] & causal_mask(T, S)


def mask_without_offset(lengths, T, S):
    return _is_real(lengths, S)[:, None, None, :] & torch.ones(T, S, dtype=torch.bool).tril()


def mask_without_causal(lengths, T, S):
    return _is_real(lengths, S)[:, None, None, :].expand(len(lengths), 1, T, S)


def mask_without_padding(lengths, T, S):
    return causal_mask(T, S).expand(len(lengths), 1, T, S)


def mask_without_head_axis(lengths, T, S):
    return _is_real(lengths, S)[:, None, :] & causal_mask(T, S)  # (B, T, S)


def mask_off_by_one(lengths, T, S):
    real = torch.arange(S)[None, :] > S - lengths[:, None]  # drops the first real token
    return real[:, None, None, :] & causal_mask(T, S)


def mask_padding_reads_itself(lengths, T, S):
    queries = torch.arange(S - T, S)  # (T,)
    padded = (queries[None, :] < S - lengths[:, None])[:, None, :, None]  # (B, 1, T, 1)
    own = queries[:, None] == torch.arange(S)[None, :]  # (T, S)
    return left_padded_causal_mask(lengths, T, S) | (padded & own)


def mask_for_every_position(lengths, T, S):
    return left_padded_causal_mask(lengths, S, S)  # (B, 1, S, S): all positions ask


# Plausible wrong chunked attention ----------------------------------------------------------


def attention_all_at_once(q, k, v, chunk):
    return scaled_dot_product_attention(q, k, v, causal_mask(q.shape[-2]))[0]


def attention_fused_all_at_once(q, k, v, chunk):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _chunks(q, k, v, chunk, mask_of, keys_of):
    T, pieces = q.shape[-2], []
    for start in range(0, T, chunk):
        end = min(start + chunk, T)
        first = keys_of(start)
        pieces.append(scaled_dot_product_attention(
            q[..., start:end, :], k[..., first:end, :], v[..., first:end, :],
            mask_of(start, end))[0])
    return torch.cat(pieces, dim=-2)


def chunks_without_mask(q, k, v, chunk):
    return _chunks(q, k, v, chunk, lambda start, end: None, lambda start: 0)


def chunks_reading_only_themselves(q, k, v, chunk):
    return _chunks(q, k, v, chunk, lambda start, end: causal_mask(end - start),
                   lambda start: start)


def chunks_without_offset(q, k, v, chunk):
    return _chunks(q, k, v, chunk,
                   lambda start, end: torch.ones(end - start, end, dtype=torch.bool).tril(),
                   lambda start: 0)


def chunks_dropping_the_rest(q, k, v, chunk):
    T = q.shape[-2]
    pieces = [scaled_dot_product_attention(
        q[..., s:s + chunk, :], k[..., :s + chunk, :], v[..., :s + chunk, :],
        causal_mask(chunk, s + chunk))[0] for s in range(0, T - chunk + 1, chunk)]
    return torch.cat(pieces, dim=-2)


def chunks_returning_the_last(q, k, v, chunk):
    T = q.shape[-2]
    for start in range(0, T, chunk):
        end = min(start + chunk, T)
        out, _ = scaled_dot_product_attention(q[..., start:end, :], k[..., :end, :],
                                              v[..., :end, :], causal_mask(end - start, end))
    return out


def chunks_without_scale(q, k, v, chunk):
    return chunked_causal_attention(q * math.sqrt(q.shape[-1]), k, v, chunk)


WRONG = [
    # (checker, wrong solution, fragments that the verdict must contain)
    (check_score_scale, lambda d_k, sigma: math.sqrt(d_k),
     ["1 of 4 checks passed", "expected 32, got 8", "σ is missing"]),
    (check_score_scale, lambda d_k, sigma: sigma * math.sqrt(d_k),
     ["one factor σ is missing", "σ² · σ² = σ⁴"]),
    (check_score_scale, lambda d_k, sigma: d_k * sigma**4, ["the variance of q · k"]),
    (check_score_scale, lambda d_k, sigma: d_k * sigma**2, ["d_k enters as √d_k"]),
    (check_score_scale, lambda d_k, sigma: math.sqrt(d_k) / sigma**2, ["σ² belongs"]),
    (check_score_scale, lambda d_k, sigma: f"{sigma**2 * math.sqrt(d_k)}",
     ["the scale should be a number, got a value of type str"]),
    (check_left_padded_causal_mask, mask_padded_on_the_right,
     ["1 of 4 checks passed", "wrong values in the mask at sequence 1", "pads on the right"]),
    (check_left_padded_causal_mask, mask_without_offset,
     ["1 of 4 checks passed", "shift the diagonal of the causal part by S - T"]),
    (check_left_padded_causal_mask, mask_without_causal,
     ["combine the padding with the causal mask"]),
    (check_left_padded_causal_mask, mask_without_padding,
     ["1 of 4 checks passed", "padding keys are visible"]),
    (check_left_padded_causal_mask, mask_without_head_axis,
     ["wrong shape for the mask: expected (B, 1, T, S) = (3, 1, 4, 4), got (3, 4, 4)",
      "pair sequence b with head b"]),
    (check_left_padded_causal_mask,
     lambda lengths, T, S: mask_without_causal(lengths, T, S)[..., :1, :],
     ["got (2, 1, 1, 5)", "key padding alone"]),
    (check_left_padded_causal_mask, mask_for_every_position,
     ["got (2, 1, 5, 5)", "only the last T positions ask"]),
    (check_left_padded_causal_mask, mask_off_by_one, ["off by one: the first real token"]),
    (check_left_padded_causal_mask, mask_padding_reads_itself,
     ["padded queries may read their own padding"]),
    (check_left_padded_causal_mask,
     lambda lengths, T, S: ~left_padded_causal_mask(lengths, T, S), ["this mask is inverted"]),
    (check_left_padded_causal_mask,
     lambda lengths, T, S: left_padded_causal_mask(lengths, T, S).int(), ["should be boolean"]),
    (check_chunked_causal_attention, attention_all_at_once,
     ["6 of 8 checks passed", "shape (2, 3, 12, 12) was created", "one chunk of queries"]),
    (check_chunked_causal_attention, attention_fused_all_at_once,
     ["6 of 8 checks passed", "F.scaled_dot_product_attention ran on 12 queries at once"]),
    (check_chunked_causal_attention, chunks_without_mask,
     ["wrong values in the output", "later positions of their own chunk"]),
    (check_chunked_causal_attention, chunks_reading_only_themselves,
     ["each chunk reads only its own keys: a query reads every earlier position"]),
    (check_chunked_causal_attention, chunks_without_offset,
     ["ignores where the chunk starts"]),
    (check_chunked_causal_attention, chunks_dropping_the_rest,
     ["expected (..., T, Dv) = (10, 8), got (8, 8)", "T = 10 is not a multiple of chunk = 4"]),
    (check_chunked_causal_attention, chunks_returning_the_last, ["only one chunk came back"]),
    (check_chunked_causal_attention, chunks_without_scale, ["not divided by √D (√8 = 2.83)"]),
]


test_wrong_solution_is_rejected_with_the_reason, test_every_checker_knows_at_least_two_mistakes = (
    mistake_tests(WRONG, ch01_attention))


# Plausible wrong masked softmaxes and attentions (the core exercises) ---------------------------

masked_softmax, attention = references("01_attention", "masked_softmax", "attention")


def _exp_normalise(z, dim=-1):
    e = (z - z.amax(dim=dim, keepdim=True)).exp()
    return e / e.sum(dim=dim, keepdim=True)


def softmax_blocking_with_zero(scores, mask=None):
    return _exp_normalise(scores if mask is None else scores.masked_fill(~mask, 0.0))


def softmax_zeroed_after(scores, mask=None):
    weights = _exp_normalise(scores.float()).to(scores.dtype)
    return weights if mask is None else weights * mask


def softmax_over_the_queries(scores, mask=None):
    z = scores if mask is None else scores.masked_fill(~mask, float("-inf"))
    return _exp_normalise(z, dim=0).nan_to_num(0.0)


def softmax_without_the_maximum(scores, mask=None):
    e = scores.exp() if mask is None else scores.exp() * mask
    return e / e.sum(dim=-1, keepdim=True)


def softmax_nan_for_a_blind_query(scores, mask=None):
    z = scores.float() if mask is None else scores.float().masked_fill(~mask, float("-inf"))
    return _exp_normalise(z).to(scores.dtype)


def softmax_in_float32(scores, mask=None):
    return masked_softmax(scores.float(), mask)


def _attention_with(scale_of, dim=-1, mask_after=False):
    def wrong(q, k, v, mask=None):
        scores = q @ k.transpose(-2, -1) * scale_of(q, k, v)  # (..., T, S)
        if mask_after:
            weights = masked_softmax(scores) * (1 if mask is None else mask)
        elif dim == -1:
            weights = masked_softmax(scores, mask)
        else:
            z = scores if mask is None else scores.masked_fill(~mask, float("-inf"))
            weights = _exp_normalise(z, dim=-2).nan_to_num(0.0)
        return weights @ v, weights
    return wrong


def _by_d(q, k, v):
    return 1 / math.sqrt(q.shape[-1])


CORE_WRONG = [
    (check_masked_softmax, softmax_blocking_with_zero, ["a blocked score set to 0"]),
    (check_masked_softmax, softmax_zeroed_after, ["zeroing the blocked weights after"]),
    (check_masked_softmax, softmax_over_the_queries, ["the wrong axis"]),
    (check_masked_softmax, softmax_without_the_maximum, ["subtract each row's maximum"]),
    (check_masked_softmax, softmax_nan_for_a_blind_query, ["0 / 0"]),
    (check_masked_softmax, softmax_in_float32, ["expected torch.bfloat16, got torch.float32",
                                                "keep the dtype of the inputs"]),
    (check_attention, _attention_with(lambda q, k, v: 1 / math.sqrt(v.shape[-1])),
     ["not of v (Dv = 6)"]),
    (check_attention, _attention_with(lambda q, k, v: 1.0), ["divide the scores by √D"]),
    (check_attention, _attention_with(lambda q, k, v: 1 / math.sqrt(k.shape[-2])),
     ["not the number of keys"]),
    (check_attention, _attention_with(_by_d, dim=-2), ["the softmax ran over the queries"]),
    (check_attention, _attention_with(_by_d, mask_after=True),
     ["the mask was applied after the softmax"]),
    (check_attention, lambda q, k, v, mask=None: attention(q, k, v, mask)[::-1],
     ["wrong shape for the weights: expected (..., T, S) = (3, 5), got (3, 6)"]),
]

test_core_mistake_is_rejected_with_the_reason, test_every_core_checker_knows_two_mistakes = (
    mistake_tests(CORE_WRONG, ch01_softmax_attention))
