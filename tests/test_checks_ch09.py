"""Chapter 9's checkers (``transformer_lib/checks/ch09_attention_variants.py``) name the usual
mistakes in words a student can act on. The contract every checker keeps is in
``test_checks_contract.py``."""
from __future__ import annotations

import torch

from transformer_lib.checks import (
    ch09_attention_variants,
    check_gated_delta_step,
    check_mla_cache_bytes,
    check_moe_forward,
)
from transformer_lib.variants.linear import gated_delta_rule_recurrent
from transformer_lib.variants.moe import MoEFeedForward

from chapter_solutions import references
from conftest import mistake_tests

gated_delta_step, mla_cache_bytes, moe_forward = references(
    "09_attention_variants", "gated_delta_step", "mla_cache_bytes", "moe_forward")


def bytes_with(*, latents=1, rope_per_head=False, rope=True, layers=True, bits=False):
    """mla_cache_bytes with one of the usual mistakes."""

    def cache_bytes(n_layers, kv_lora_rank, qk_rope_head_dim, n_heads, T, batch_size, dtype):
        rope_part = qk_rope_head_dim * (n_heads if rope_per_head else 1) if rope else 0
        per_token = (latents * kv_lora_rank + rope_part) * (n_layers if layers else 1)
        return per_token * T * batch_size * dtype.itemsize * (8 if bits else 1)

    return cache_bytes


def step_with(*, erase_beta=True, alpha_after=False, transposed=False, read_old=False,
              normalise=True):
    """gated_delta_step with one of the usual mistakes."""

    def step(S, q, k, v, alpha, beta):
        if normalise:
            q, k = q / q.norm(dim=-1, keepdim=True), k / k.norm(dim=-1, keepdim=True)
        a, b = alpha[..., None, None], beta[..., None, None]
        if transposed:  # state (Dk, Dv), written k vᵀ
            erased = S - b * k[..., None] @ (k[..., None, :] @ S)
            new = a * erased + b * k[..., None] @ v[..., None, :]
            return new, (q[..., None, :] @ (S if read_old else new))[..., 0, :]
        old = S @ k[..., None]  # (B, H, Dv, 1)
        erased = S - (b if erase_beta else 1.0) * old @ k[..., None, :]
        write = b * v[..., None] @ k[..., None, :]
        new = a * (erased + write) if alpha_after else a * erased + write
        return new, ((S if read_old else new) @ q[..., None])[..., 0]

    return step


def moe_with(*, renormalise=True, top1=False, per_token=False, dense=False, factor=True,
             p_from_gates=False):
    """moe_forward with one of the usual mistakes."""

    def forward(x, router, experts, top_k):
        probs = torch.softmax(router(x), dim=-1)
        top, chosen = probs.topk(1 if top1 else top_k, dim=-1)
        gates = top / top.sum(dim=-1, keepdim=True) if renormalise else top
        weights = torch.zeros_like(probs).scatter(1, chosen, gates)  # (N, E)
        out = torch.zeros_like(x)
        for e, expert in enumerate(experts):
            if dense:
                out = out + weights[:, e, None] * expert(x)
                continue
            token = (chosen == e).any(dim=-1).nonzero()[:, 0]
            if len(token):
                out = out.index_add(0, token, weights[token, e, None] * expert(x[token]))
        counts = torch.bincount(chosen.flatten(), minlength=len(experts)).float()
        f = counts / (x.shape[0] if per_token else chosen.numel())
        P = (weights if p_from_gates else probs).mean(dim=0)
        return out, (len(experts) if factor else 1) * (f * P).sum()

    return forward


WRONG = [
    # (checker, wrong solution, fragments that the verdict must contain)
    (check_mla_cache_bytes, bytes_with(latents=2),
     ["0 of 4 checks passed", "wrong value for the cache's bytes: expected 70272, got 132736",
      "the latent is cached once"]),
    (check_mla_cache_bytes, bytes_with(rope_per_head=True), ["shared by all heads"]),
    (check_mla_cache_bytes, bytes_with(rope=False), ["the cache also holds the RoPE key"]),
    (check_mla_cache_bytes, bytes_with(layers=False), ["multiply by n_layers"]),
    (check_mla_cache_bytes, bytes_with(bits=True), ["this counts bits"]),
    (check_mla_cache_bytes, lambda *args: mla_cache_bytes(*args) / 1024,
     ["wrong value for the cache's bytes"]),
    (check_gated_delta_step, step_with(erase_beta=False),
     ["0 of 3 checks passed", "wrong values in S_new", "β scales the erase term too"]),
    (check_gated_delta_step, step_with(alpha_after=True),
     ["1 of 3 checks passed", "α was applied after the write"]),
    (check_gated_delta_step, step_with(transposed=True),
     ["0 of 3 checks passed", "raised RuntimeError", "the state S is (B, H, Dv, Dk)",
      "wrong values in S_new", "it is (Dv, Dk), and the write is v kᵀ"]),
    (check_gated_delta_step, step_with(read_old=True),
     ["wrong values in o", "the output reads the state before this token's write"]),
    (check_gated_delta_step, step_with(normalise=False),
     ["0 of 3 checks passed", "normalise k to unit length"]),
    (check_gated_delta_step, lambda *args: (gated_delta_step(*args)[0].transpose(-2, -1),
                                            gated_delta_step(*args)[1]),
     ["wrong shape for S_new: expected (B, H, Dv, Dk) = (2, 3, 5, 4), got (2, 3, 4, 5)",
      "keep it (Dv, Dk), and write v kᵀ"]),
    (check_gated_delta_step, lambda *args: gated_delta_step(*args)[0],
     ["return the pair (S_new, o)"]),
    (check_moe_forward, moe_with(renormalise=False),
     ["0 of 4 checks passed", "wrong values in out", "renormalise the k chosen probabilities"]),
    (check_moe_forward, moe_with(top1=True),
     ["not only to the most probable one"]),
    (check_moe_forward, moe_with(per_token=True),
     ["wrong value for the balance loss", "divide the counts by N·top_k"]),
    (check_moe_forward, moe_with(p_from_gates=True), ["not from the gates"]),
    (check_moe_forward, moe_with(factor=False), ["1 for a perfectly balanced router"]),
    (check_moe_forward, moe_with(dense=True),
     ["0 of 4 checks passed", "the experts ran on 48 token rows in all, for 12 tokens with "
      "top_k = 2: expected 24", "run each expert only on the tokens routed to it"]),
]


def test_the_step_reference_is_one_token_of_the_library_recurrence():
    """The checker's reference, written out, is the library's Gated DeltaNet for T = 1."""
    B, H, Dk, Dv = 2, 3, 4, 5
    S, v = torch.randn(B, H, Dv, Dk), torch.randn(B, H, Dv)
    q, k = torch.randn(B, H, Dk), torch.randn(B, H, Dk)
    alpha, beta = torch.rand(B, H) * 0.5 + 0.5, torch.rand(B, H) * 0.9 + 0.05
    out, state = gated_delta_rule_recurrent(q[:, :, None], k[:, :, None], v[:, :, None],
                                            alpha[..., None], beta[..., None], S)
    new, o = ch09_attention_variants._gated_step(S, q, k, v, alpha, beta)
    torch.testing.assert_close(new, state, atol=1e-6, rtol=0)
    torch.testing.assert_close(o, out[:, :, 0], atol=1e-6, rtol=0)


def test_the_moe_reference_is_the_library_layer():
    """The checker's dense reference equals the library's MoEFeedForward, experts and router
    shared, and so does the reference solution."""
    layer = MoEFeedForward(8, 16, n_experts=6, top_k=2)
    experts = torch.nn.ModuleList()
    for expert in layer.experts:
        wrapped = ch09_attention_variants._CountingExpert(8, 16)
        wrapped.ffn = expert
        experts.append(wrapped)
    x = torch.randn(10, 8)
    with torch.no_grad():
        out, aux = layer(x)
        ref_out, ref_loss = ch09_attention_variants._moe(x, layer.router, experts, 2)
        sol_out, sol_loss = moe_forward(x, layer.router, experts, 2)
    torch.testing.assert_close(ref_out, out, atol=1e-6, rtol=0)
    torch.testing.assert_close(ref_loss, aux, atol=1e-6, rtol=0)
    torch.testing.assert_close(sol_out, out, atol=1e-6, rtol=0)
    torch.testing.assert_close(sol_loss.to(aux.dtype), aux, atol=1e-6, rtol=0)


def test_the_mla_reference_is_the_library_cache():
    from transformer_lib.variants.mla import MLACache

    cache = MLACache(3, 10, 24, 8, dtype=torch.float32, device="meta")
    assert cache.nbytes == 2 * mla_cache_bytes(1, 24, 8, 4, 10, 3, torch.float32) // 2
    assert ch09_attention_variants._mla_bytes(2, 24, 8, 4, 10, 3, torch.float32) == 2 * cache.nbytes


test_wrong_solution_is_rejected_with_the_reason, test_every_checker_knows_at_least_two_mistakes = (
    mistake_tests(WRONG, ch09_attention_variants))
