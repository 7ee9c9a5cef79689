"""The cheat suite: for every exercise, submissions that get the right answer without doing the
work must fail, with a message that names what was refused.

Each planted submission is a notebook cell's source (run under ``__name__ == "__main__"``, as a
notebook runs it) that defines the exercise's function. For every exercise there is, where one
exists: a wrapper around the checker's reference (or a call of a checker), a wrapper around the
library's answer, a call of a private library function, the framework's ready-made answer, and
the specific loopholes that reviews found. Each checker stops at the first refused call, so the
whole suite costs a few seconds. The chapters' own solutions still pass
(``test_checks_contract.py::test_reference_solution_passes``).
"""
from __future__ import annotations

import importlib
from pathlib import Path

import pytest

import transformer_lib.checks as checks

PRIVATE = "private library function"
REFERENCE = "the checker's reference"
CHECKER = "a checker as an oracle"
LIBRARY = "the library's answer"
FRAMEWORK = "the framework's answer"

# (checker, what the cheat is, the cell, a fragment the refusal must name)
CHEATS: list[tuple[str, str, str, str]] = [
    # Chapter 0 -------------------------------------------------------------------------------
    ("check_mha_shapes", LIBRARY, """
import torch
from transformer_lib.attention import MultiHeadAttention
def mha_shapes(B, T, S, C, H, H_kv):
    with torch.device("meta"):
        layer = MultiHeadAttention(C, H, n_kv_heads=H_kv)
        q = layer.q_proj(torch.empty(B, T, C)).view(B, T, H, C // H).transpose(1, 2)
        k = layer.k_proj(torch.empty(B, S, C)).view(B, S, H_kv, C // H).transpose(1, 2)
    return tuple(q.shape), tuple(k.shape), (B, H, T, S)
""", "attention.MultiHeadAttention"),
    ("check_mha_shapes", CHECKER, """
from transformer_lib.checks import check_mha_shapes
def mha_shapes(B, T, S, C, H, H_kv):
    check_mha_shapes(lambda *a: ((0,), (0,), (0,)))
    return (B, H, T, C // H), (B, H_kv, S, C // H), (B, H, T, S)
""", "check_mha_shapes"),
    # Chapter 1 -------------------------------------------------------------------------------
    ("check_score_scale", CHECKER, """
from transformer_lib.checks import check_score_scale
def score_scale(d_k, sigma):
    for guess in (d_k ** 0.5, sigma * d_k ** 0.5, sigma ** 2 * d_k ** 0.5):
        if check_score_scale(lambda d, s, g=guess: g):
            return guess
""", "check_score_scale"),
    ("check_left_padded_causal_mask", REFERENCE, """
from transformer_lib.checks import ch01_attention
def left_padded_causal_mask(lengths, T, S):
    return ch01_attention._left_padded(lengths, T, S)
""", "ch01_attention._left_padded"),
    ("check_left_padded_causal_mask", PRIVATE, """
import torch
from transformer_lib import attention
from transformer_lib.attention import causal_mask
def left_padded_causal_mask(lengths, T, S):
    helpers = [getattr(attention, n) for n in dir(attention) if n.startswith("_heads")]
    helpers[0](torch.zeros(1, 1, 1, 1), torch.zeros(1, 1, 1, 1), torch.zeros(1, 1, 1, 1))
    real = torch.arange(S)[None, :] >= S - lengths[:, None]
    return real[:, None, None, :] & causal_mask(T, S)
""", "attention._heads_per_kv_head"),
    ("check_chunked_causal_attention", LIBRARY, """
from transformer_lib.flash import flash_attention
def chunked_causal_attention(q, k, v, chunk):
    return flash_attention(q, k, v, causal=True, block_size=chunk)
""", "flash.flash_attention"),
    ("check_chunked_causal_attention", REFERENCE, """
from transformer_lib.checks import ch01_attention as c
def chunked_causal_attention(q, k, v, chunk):
    masks = c._chunk_masks(q.shape[-2], chunk)
    return q
""", "ch01_attention._chunk_masks"),
    ("check_chunked_causal_attention", FRAMEWORK, """
import torch.nn.functional as F
def chunked_causal_attention(q, k, v, chunk):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)
""", "scaled_dot_product_attention"),
    ("check_chunked_causal_attention", "all queries with one padded key", """
import torch
from transformer_lib.attention import causal_mask, scaled_dot_product_attention
def chunked_causal_attention(q, k, v, chunk):
    T = q.shape[-2]
    k1 = torch.cat([k, torch.zeros_like(k[..., :1, :])], dim=-2)
    v1 = torch.cat([v, torch.zeros_like(v[..., :1, :])], dim=-2)
    mask = torch.cat([causal_mask(T), torch.zeros(T, 1, dtype=torch.bool)], dim=-1)
    return scaled_dot_product_attention(q, k1, v1, mask=mask)[0]
""", "numbers per head, more than the weights of 3 queries"),
    ("check_chunked_causal_attention", "one query at a time, whatever the chunk", """
import torch
def chunked_causal_attention(q, k, v, chunk):
    rows = []
    for t in range(q.shape[-2]):
        w = (q[..., t:t + 1, :] @ k[..., :t + 1, :].transpose(-2, -1)) / q.shape[-1] ** 0.5
        rows.append(torch.softmax(w, dim=-1) @ v[..., :t + 1, :])
    return torch.cat(rows, dim=-2)
""", "the work grows with the size of a chunk"),
    # Chapter 2 -------------------------------------------------------------------------------
    ("check_teacher_forcing", CHECKER, """
from transformer_lib.checks import ch02_qkv_roles as c
def teacher_forcing(tgt, bos, pad):
    c._padded_targets([1], 2, pad, None)
""", "ch02_qkv_roles._padded_targets"),
    ("check_head_bilinear_forms", REFERENCE, """
from transformer_lib.checks import ch02_qkv_roles as c
def head_bilinear_forms(q_weight, k_weight, n_heads):
    return c._head_forms(q_weight, k_weight, n_heads)
""", "ch02_qkv_roles._head_forms"),
    ("check_first_future_leak", REFERENCE, """
from transformer_lib.checks import ch02_qkv_roles as c
def first_future_leak(decode, tgt):
    leaks = c._leaks(decode, tgt)
    return min((t for t, _ in leaks), default=-1)
""", "ch02_qkv_roles._leaks"),
    # Chapter 3 -------------------------------------------------------------------------------
    ("check_attention_memory", CHECKER, """
from transformer_lib.checks import ch03_multi_head as c
def attention_memory(batch, seq_len, d_model, n_heads, n_kv_heads, bytes_per_number):
    hints = c._memory_hints(batch, seq_len, d_model, n_heads, n_kv_heads, bytes_per_number)
    return 0
""", "ch03_multi_head._memory_hints"),
    ("check_split_qkv", REFERENCE, """
from transformer_lib.checks import ch03_multi_head as c
def split_qkv(qkv, n_heads):
    return c._split_qkv(qkv, n_heads)
""", "ch03_multi_head._split_qkv"),
    ("check_to_per_head_layout", REFERENCE, """
from transformer_lib.checks import ch03_multi_head as c
def to_per_head_layout(t, n_heads):
    return c._to_per_head(t, n_heads)
""", "ch03_multi_head._to_per_head"),
    # Chapter 4 -------------------------------------------------------------------------------
    ("check_noam_for_base_lr", REFERENCE, """
from transformer_lib.checks import ch04_normalisation as c
def noam_for_base_lr(d_model, warmup, base_lr):
    return lambda step: c._noam(d_model, warmup, step + 1) / c._noam(d_model, warmup, warmup)
""", "ch04_normalisation._noam"),
    ("check_noam_for_base_lr", LIBRARY, """
from transformer_lib.tasks import noam_lambda
def noam_for_base_lr(d_model, warmup, base_lr):
    return noam_lambda(d_model, warmup)
""", "noam_lambda"),
    ("check_rezero_encoder_layer", LIBRARY, """
def rezero_encoder_layer(layer, x, alpha):
    return layer(x)
""", "EncoderLayer.forward"),
    ("check_rezero_encoder_layer", REFERENCE, """
from transformer_lib.checks import ch04_normalisation as c
def rezero_encoder_layer(layer, x, alpha):
    return c._rezero(layer, x, alpha)
""", "ch04_normalisation._rezero"),
    ("check_deepnorm_gradient_profile", REFERENCE, """
from transformer_lib.checks import ch04_normalisation as c
def deepnorm_gradient_profile(layers, x, target):
    return c._profile(list(layers), x, target, alpha=(2 * len(layers)) ** 0.25)
""", "ch04_normalisation._profile"),
    # Chapter 5 -------------------------------------------------------------------------------
    ("check_sinusoid_shift_matrix", REFERENCE, """
from transformer_lib.checks import ch05_positions as c
def sinusoid_shift_matrix(k, d):
    return c._shift_matrix(k, d)
""", "ch05_positions._shift_matrix"),
    ("check_sinusoid_shift_matrix", "a least-squares fit of the library's table", """
import torch
from transformer_lib.positional import sinusoidal_encoding
def sinusoid_shift_matrix(k, d):
    table = sinusoidal_encoding(64 + k, d)
    return torch.linalg.lstsq(table[:64], table[k:k + 64]).solution.T
""", "positional.sinusoidal_encoding"),
    ("check_ntk_rope_tables", LIBRARY, """
from transformer_lib.positional import rope_cos_sin
def ntk_rope_tables(T, head_dim, factor, theta=10000.0):
    return rope_cos_sin(T, head_dim, theta=theta * factor ** (head_dim / (head_dim - 2)))
""", "positional.rope_cos_sin"),
    ("check_ntk_rope_tables", REFERENCE, """
from transformer_lib.checks import ch05_positions as c
def ntk_rope_tables(T, head_dim, factor, theta=10000.0):
    return c._ntk_tables(T, head_dim, factor, theta)
""", "ch05_positions._ntk_tables"),
    ("check_rope_cached_attention", REFERENCE, """
from transformer_lib.checks import ch05_positions as c
def rope_cached_attention(q, k, v, k_cache, v_cache, cos, sin):
    return c._cached_step(q, k, v, k_cache, v_cache, cos, sin)
""", "ch05_positions._cached_step"),
    ("check_rope_cached_attention", PRIVATE, """
from transformer_lib import positional
def rope_cached_attention(q, k, v, k_cache, v_cache, cos, sin):
    positional._permute_rows(q[0, 0], 1, (2, 2))
    return q, k_cache, v_cache
""", "positional._permute_rows"),
    # Chapter 6 -------------------------------------------------------------------------------
    ("check_decoder_param_count", "the library's Decoder on the meta device", """
from transformer_lib.decoder import Decoder, DecoderConfig
def decoder_param_count(vocab_size, d_model, n_layers, n_heads, n_kv_heads, d_ff,
                        tie_embeddings):
    config = DecoderConfig(vocab_size=vocab_size, d_model=d_model, n_layers=n_layers,
                           n_heads=n_heads, n_kv_heads=n_kv_heads, d_ff=d_ff,
                           tie_embeddings=tie_embeddings)
    import torch
    with torch.device("meta"):
        model = Decoder(config)
    return sum(p.numel() for p in model.parameters())
""", "DecoderConfig"),
    ("check_decoder_param_count", REFERENCE, """
from transformer_lib.checks import ch06_modern_decoder as c
def decoder_param_count(vocab_size, d_model, n_layers, n_heads, n_kv_heads, d_ff,
                        tie_embeddings):
    return c._param_count(vocab_size, d_model, n_layers, n_heads, n_kv_heads, d_ff,
                          tie_embeddings)
""", "ch06_modern_decoder._param_count"),
    ("check_gqa_to_mha", REFERENCE, """
from transformer_lib.checks import ch06_modern_decoder as c
def gqa_to_mha(state_dict, n_heads, n_kv_heads):
    return c._gqa_to_mha(state_dict, n_heads, n_kv_heads)
""", "ch06_modern_decoder._gqa_to_mha"),
    ("check_qk_norm_attention", REFERENCE, """
from transformer_lib.checks import ch06_modern_decoder as c
def qk_norm_attention(x, attn, q_norm, k_norm, cos, sin):
    return c._qk_norm_attention(x, attn, q_norm, k_norm, cos, sin)
""", "ch06_modern_decoder._qk_norm_attention"),
    ("check_qk_norm_attention", FRAMEWORK, """
import torch.nn.functional as F
def qk_norm_attention(x, attn, q_norm, k_norm, cos, sin):
    return F.rms_norm(x, x.shape[-1:])
""", "torch.nn.functional.rms_norm"),
    ("check_qk_norm_attention", "the layer's own forward", """
def qk_norm_attention(x, attn, q_norm, k_norm, cos, sin):
    return attn(x, rope=(cos, sin), causal=True)
""", "MultiHeadAttention.forward"),
    # Chapter 7 -------------------------------------------------------------------------------
    ("check_max_context", REFERENCE, """
from transformer_lib.checks import ch07_kv_cache as c
def max_context(budget_bytes, n_layers, d_model, n_heads, n_kv_heads, batch_size, dtype):
    return c._max_context(budget_bytes, n_layers, d_model, n_heads, n_kv_heads, batch_size,
                          dtype)
""", "ch07_kv_cache._max_context"),
    ("check_batched_generation", LIBRARY, """
import torch
def generate_batch(model, prompts, max_new_tokens):
    return torch.cat([model.generate(p[None], max_new_tokens)[:, len(p):] for p in prompts])
""", "Decoder.generate"),
    ("check_batched_generation", REFERENCE, """
import torch
from transformer_lib.checks import ch07_kv_cache as c
def generate_batch(model, prompts, max_new_tokens):
    return torch.cat([c._greedy(model, p[None], max_new_tokens) for p in prompts])
""", "ch07_kv_cache._greedy"),
    ("check_speculative_step", REFERENCE, """
from transformer_lib.checks import ch07_kv_cache as c
def speculative_step(model, cache, pending, draft):
    return c._speculative_reference(model, cache, pending, draft)
""", "ch07_kv_cache._speculative_reference"),
    ("check_speculative_step", LIBRARY, """
import torch
def speculative_step(model, cache, pending, draft):
    return model.generate(pending, draft.shape[-1] + 1)
""", "Decoder.generate"),
    # Chapter 8 -------------------------------------------------------------------------------
    ("check_merge_softmax_stats", REFERENCE, """
from transformer_lib.checks import ch08_fast_attention as c
def merge_softmax_stats(m1, l1, acc1, m2, l2, acc2):
    return c._merge(m1, l1, acc1, m2, l2, acc2)
""", "ch08_fast_attention._merge"),
    ("check_tiled_causal_attention", LIBRARY, """
from transformer_lib.flash import flash_attention
def tiled_causal_attention(q, k, v, block_q, block_k):
    return flash_attention(q, k, v, causal=True, block_size=block_q), 0
""", "flash.flash_attention"),
    ("check_tiled_causal_attention", PRIVATE, """
import transformer_lib.flash as fl
def tiled_causal_attention(q, k, v, block_q, block_k):
    tiling = fl._tiling(q, k, None, True, block_q)
    return q, 0
""", "flash._tiling"),
    ("check_tiled_causal_attention", REFERENCE, """
from transformer_lib.checks import ch08_fast_attention as c
def tiled_causal_attention(q, k, v, block_q, block_k):
    return (c._causal_reference(q, k, v),
            c._tiles_needed(q.shape[-2], k.shape[-2], block_q, block_k))
""", "ch08_fast_attention._causal_reference"),
    ("check_tiled_causal_attention", FRAMEWORK, """
import torch.nn.functional as F
def tiled_causal_attention(q, k, v, block_q, block_k):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True), 0
""", "torch.nn.functional.scaled_dot_product_attention"),
    ("check_tiled_causal_attention", "a loop over queries within each tile", """
import math
import torch
def tiled_causal_attention(q, k, v, block_q, block_k):
    T, S = q.shape[-2], k.shape[-2]
    out, n_tiles = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype), 0
    for start in range(0, T, block_q):
        for key_start in range(0, S, block_k):
            if key_start > S - T + min(start + block_q, T) - 1:
                continue
            n_tiles += 1
    for t in range(T):
        m = torch.full(q.shape[:-2], -math.inf, dtype=q.dtype)
        l = torch.zeros(q.shape[:-2], dtype=q.dtype)
        acc = torch.zeros(*q.shape[:-2], v.shape[-1], dtype=q.dtype)
        last = S - T + t
        for key_start in range(0, last + 1, block_k):
            kb, vb = k[..., key_start:min(key_start + block_k, last + 1), :], v[..., key_start:min(key_start + block_k, last + 1), :]
            s = (kb @ q[..., t, :, None]).squeeze(-1) / math.sqrt(q.shape[-1])
            m_new = torch.maximum(m, s.amax(-1))
            p = (s - m_new[..., None]).exp()
            l = l * (m - m_new).exp() + p.sum(-1)
            acc = acc * (m - m_new).exp()[..., None] + (p[..., None, :] @ vb).squeeze(-2)
            m = m_new
        out[..., t, :] = acc / l[..., None]
    return out, n_tiles
""", "the work grows with the size of a tile"),
    ("check_combine_splits", REFERENCE, """
from transformer_lib.checks import ch08_fast_attention as c
def combine_splits(outs, lses):
    return c._combine(outs, lses)
""", "ch08_fast_attention._combine"),
    # Chapter 9 -------------------------------------------------------------------------------
    ("check_mla_cache_bytes", LIBRARY, """
from transformer_lib.variants.mla import MLACache
def mla_cache_bytes(n_layers, kv_lora_rank, qk_rope_head_dim, n_heads, T, batch_size,
                    latent_dtype, rope_dtype):
    return n_layers * MLACache(batch_size, T, kv_lora_rank, qk_rope_head_dim).nbytes
""", "MLACache"),
    ("check_mla_cache_bytes", REFERENCE, """
from transformer_lib.checks import ch09_attention_variants as c
def mla_cache_bytes(n_layers, kv_lora_rank, qk_rope_head_dim, n_heads, T, batch_size,
                    latent_dtype, rope_dtype):
    return c._mla_bytes(n_layers, kv_lora_rank, qk_rope_head_dim, n_heads, T, batch_size,
                        latent_dtype, rope_dtype)
""", "ch09_attention_variants._mla_bytes"),
    ("check_gated_delta_chunk", LIBRARY, """
from transformer_lib.variants.linear import gated_delta_rule_chunked
def gated_delta_chunk(S, q, k, v, alpha, beta):
    return gated_delta_rule_chunked(q, k, v, alpha, beta, chunk_size=q.shape[-2], state=S)
""", "gated_delta_rule_chunked"),
    ("check_gated_delta_chunk", REFERENCE, """
from transformer_lib.checks import ch09_attention_variants as c
def gated_delta_chunk(S, q, k, v, alpha, beta):
    return c._gated_chunk(S, q, k, v, alpha, beta)
""", "ch09_attention_variants._gated_chunk"),
    ("check_gated_delta_chunk", "the token-by-token recurrence", """
import torch
def gated_delta_chunk(S, q, k, v, alpha, beta):
    outs = []
    for t in range(q.shape[-2]):
        kt, vt, qt = k[..., t, :], v[..., t, :], q[..., t, :]
        a, b = alpha[..., t, None, None], beta[..., t, None, None]
        S = a * (S - b * (S @ kt[..., :, None]) @ kt[..., None, :]) + b * vt[..., :, None] @ kt[..., None, :]
        outs.append((S @ qt[..., :, None]).squeeze(-1))
    return torch.stack(outs, dim=-2), S
""", "the work grows with the size of a chunk"),
    ("check_moe_forward", REFERENCE, """
from transformer_lib.checks import ch09_attention_variants as c
def moe_forward(x, router, experts, top_k):
    return c._moe(x, router, experts, top_k)
""", "ch09_attention_variants._moe"),
    ("check_moe_forward", LIBRARY, """
from transformer_lib.variants.moe import load_balancing_loss
def moe_forward(x, router, experts, top_k):
    probs = router(x).softmax(-1)
    return x, load_balancing_loss(probs, probs.topk(top_k, -1).indices, len(experts))
""", "load_balancing_loss"),
    ("check_ring_causal_attention", REFERENCE, """
from transformer_lib.checks import ch09_long_context as c
def ring_causal_attention(q, k, v, owner):
    return c._ring(q, k, v, owner)
""", "ch09_long_context._ring"),
    ("check_ring_causal_attention", FRAMEWORK, """
import torch.nn.functional as F
def ring_causal_attention(q, k, v, owner):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)
""", "scaled_dot_product_attention"),
    ("check_ring_causal_attention", LIBRARY, """
from transformer_lib.flash import flash_attention
def ring_causal_attention(q, k, v, owner):
    return flash_attention(q[None], k[None], v[None], causal=True, block_size=4)[0]
""", "flash.flash_attention"),
    ("check_ring_causal_attention", "one query row at a time over the whole sequence", """
import math
import torch
def ring_causal_attention(q, k, v, owner):
    rows = [torch.softmax(q[t:t + 1] @ k[:t + 1].T / math.sqrt(q.shape[-1]), -1) @ v[:t + 1]
            for t in range(len(q))]
    return torch.cat(rows)
""", "wider than one device's"),
]


# More planted cheats, a file per chapter: tests/cheats_chNN.py, each with its own CHEATS.
for _path in sorted(Path(__file__).parent.glob("cheats_ch*.py")):
    CHEATS += importlib.import_module(_path.stem).CHEATS


def _define(source: str, name: str):
    """The function ``name`` from ``source``, run as a notebook cell."""
    namespace = {"__name__": "__main__"}
    exec(compile(source, "<cell>", "exec"), namespace)
    return namespace[name]


def _function_name(checker: str) -> str:
    from chapter_solutions import SOLUTIONS
    return SOLUTIONS[checker].__name__


@pytest.mark.parametrize("checker, what, source, names", CHEATS,
                         ids=[f"{c.removeprefix('check_')}: {w}" for c, w, _, _ in CHEATS])
def test_a_planted_cheat_fails_and_the_report_names_what_was_refused(checker, what, source,
                                                                        names, capsys):
    cheat = _define(source, _function_name(checker))
    result = getattr(checks, checker)(cheat)
    printed = capsys.readouterr().out
    assert not result and result.attempted, printed
    assert names in printed, printed


def test_every_exercise_has_planted_cheats():
    from chapter_solutions import SOLUTIONS
    planted = {checker for checker, *_ in CHEATS}
    assert planted == set(SOLUTIONS)


def test_every_exercise_states_what_it_allows():
    """The task names what the checker lets the student call: the line of its Rules."""
    from chapter_solutions import _notebook, chapter_exercises
    assert set(checks.EXERCISE_RULES) == {e.function for listed in chapter_exercises().values()
                                          for e in listed}
    for chapter, listed in chapter_exercises().items():
        cells = _notebook(chapter).cells
        for exercise in listed:
            task = cells[exercise.cell - 1].source
            assert "{exercise}" in task, (chapter, exercise.function)
            line = checks.EXERCISE_RULES[exercise.function].sentence()
            assert f"\n\n{line}\n" in task, (chapter, exercise.function, line)
