"""Chapter 9's checkers (``transformer_lib/checks/ch09_attention_variants.py``) name the usual
mistakes in words a student can act on. The contract every checker keeps is in
``test_checks_contract.py``."""
from __future__ import annotations

import torch

from transformer_lib.checks import (
    ch09_attention_variants,
    check_gated_delta_chunk,
    check_mla_cache_bytes,
    check_moe_forward,
)
from transformer_lib.variants.linear import (
    delta_rule_chunked,
    gated_delta_rule_chunked,
    gated_delta_rule_recurrent,
)
from transformer_lib.variants.moe import MoEFeedForward

from chapter_solutions import references
from conftest import mistake_tests

gated_delta_chunk, mla_cache_bytes, moe_forward = references(
    "09_attention_variants", "gated_delta_chunk", "mla_cache_bytes", "moe_forward")


def bytes_with(*, latents=1, rope_per_head=False, rope=True, layers=True, bits=False,
               one_dtype=False):
    """mla_cache_bytes with one of the usual mistakes."""

    def cache_bytes(n_layers, kv_lora_rank, qk_rope_head_dim, n_heads, T, batch_size,
                    latent_dtype, rope_dtype):
        rope_size = (latent_dtype if one_dtype else rope_dtype).itemsize
        rope_part = qk_rope_head_dim * (n_heads if rope_per_head else 1) if rope else 0
        per_token = ((latents * kv_lora_rank * latent_dtype.itemsize + rope_part * rope_size)
                     * (n_layers if layers else 1))
        return per_token * T * batch_size * (8 if bits else 1)

    return cache_bytes


def chunk_with(*, solve=True, decays_in_system=True, read_decayed=True, own_write=True,
               correct=True, final_decay=True):
    """gated_delta_chunk with one of the usual mistakes, written with explicit loops over
    the chunk's tokens for the WY vectors."""

    def chunk(S, q, k, v, alpha, beta):
        L = q.shape[-2]
        gamma = torch.cumprod(alpha, dim=-1)  # (B, H, L)
        w, u = [], []
        for t in range(L):  # w_t = β_t (γ_t k_t − Σ_s Γ_ts (k_s·k_t) w_s), u_t alike
            w_t, u_t = gamma[..., t, None] * k[..., t, :], v[..., t, :]
            for s_ in range(t if solve else 0):
                c = (k[..., s_, :] * k[..., t, :]).sum(-1, keepdim=True)
                if decays_in_system:
                    c = c * (gamma[..., t, None] / gamma[..., s_, None])
                w_t, u_t = w_t - c * w[s_], u_t - c * u[s_]
            w.append(beta[..., t, None] * w_t)
            u.append(beta[..., t, None] * u_t)
        W, U = torch.stack(w, dim=-2), torch.stack(u, dim=-2)
        new_v = U - W @ S.transpose(-2, -1) if correct else U
        Gamma = (gamma[..., :, None] / gamma[..., None, :]).tril(0 if own_write else -1)
        out = ((gamma[..., None] if read_decayed else 1.0) * (q @ S.transpose(-2, -1))
               + ((q @ k.transpose(-2, -1)) * Gamma) @ new_v)
        end = gamma[..., -1:] / gamma if final_decay else torch.ones_like(gamma)
        return out, gamma[..., -1, None, None] * S + new_v.transpose(-2, -1) @ (end[..., None] * k)

    return chunk


def library_cache_bytes(n_layers, kv_lora_rank, qk_rope_head_dim, n_heads, T, batch_size,
                        latent_dtype, rope_dtype):
    """The library's MLA cache, built on the meta device: one dtype for both parts."""
    from transformer_lib.variants.mla import MLACache

    cache = MLACache(batch_size, T, kv_lora_rank, qk_rope_head_dim, dtype=latent_dtype,
                     device="meta")
    return n_layers * cache.nbytes


def library_moe(x, router, experts, top_k):
    """The right output, with the balance loss from the library's load_balancing_loss."""
    from transformer_lib.variants.moe import load_balancing_loss

    out, _ = moe_forward(x, router, experts, top_k)
    probs = torch.softmax(router(x), dim=-1)
    return out, load_balancing_loss(probs, probs.topk(top_k, dim=-1)[1], len(experts))


def library_chunk(S, q, k, v, alpha, beta):
    """The right numbers, from the library's chunked Gated DeltaNet."""
    return gated_delta_rule_chunked(q, k, v, alpha, beta, state=S, normalize=False)


def library_delta_chunk(S, q, k, v, alpha, beta):
    """The library's ungated chunked form: right only where α = 1."""
    return delta_rule_chunked(q, k, v, beta, state=S, normalize=False)


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
     ["0 of 5 checks passed", "wrong value for the cache's bytes: expected 70272, got 132736",
      "the latent is cached once"]),
    (check_mla_cache_bytes, bytes_with(rope_per_head=True), ["shared by all heads"]),
    (check_mla_cache_bytes, bytes_with(rope=False), ["the cache also holds the RoPE key"]),
    (check_mla_cache_bytes, bytes_with(layers=False), ["multiply by n_layers"]),
    (check_mla_cache_bytes, bytes_with(bits=True), ["this counts bits"]),
    (check_mla_cache_bytes, lambda *args: mla_cache_bytes(*args) / 1024,
     ["wrong value for the cache's bytes"]),
    (check_mla_cache_bytes, bytes_with(one_dtype=True),
     ["2 of 5 checks passed", "the RoPE key has its own dtype"]),
    (check_gated_delta_chunk, chunk_with(solve=False),
     ["wrong values in out", "solve the unit"]),
    (check_gated_delta_chunk, chunk_with(decays_in_system=False),
     ["2 of 5 checks passed", "the decays enter the triangular system too"]),
    (check_gated_delta_chunk, chunk_with(read_decayed=False),
     ["token t reads the starting state after it has decayed"]),
    (check_gated_delta_chunk, chunk_with(own_write=False),
     ["0 of 5 checks passed", "keep the diagonal of the causal mask"]),
    (check_gated_delta_chunk, chunk_with(correct=False),
     ["corrected by what the starting state already returns: u_s − S₀ w_s"]),
    (check_gated_delta_chunk, chunk_with(final_decay=False),
     ["wrong values in S_new", "decayed by γ_L / γ_s at the chunk's end"]),
    (check_gated_delta_chunk, library_chunk,
     ["0 of 5 checks passed", ".gated_delta_rule_chunked` is not allowed here"]),
    (check_gated_delta_chunk, library_delta_chunk, [".delta_rule_chunked` is not allowed here"]),
    (check_gated_delta_chunk, lambda *args: (gated_delta_chunk(*args)[0],
                                             gated_delta_chunk(*args)[1].transpose(-2, -1)),
     ["wrong shape for S_new: expected (B, H, Dv, Dk) = (2, 3, 5, 6), got (2, 3, 6, 5)",
      "keep it (Dv, Dk)"]),
    (check_gated_delta_chunk, lambda *args: gated_delta_chunk(*args)[0],
     ["return the pair (out, S_new)"]),
    (check_mla_cache_bytes, library_cache_bytes, [".MLACache` is not allowed here"]),
    (check_moe_forward, library_moe, ["0 of 4 checks passed", ".load_balancing_loss` is not allowed here"]),
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


def test_the_chunk_reference_is_the_library_recurrence():
    """The checker's reference, written out, and the reference solution are Gated DeltaNet's
    recurrence over the chunk, in fp64 to 1e-12."""
    B, H, L, Dk, Dv = 2, 3, 9, 4, 5
    dtype = torch.float64
    S, v = torch.randn(B, H, Dv, Dk, dtype=dtype), torch.randn(B, H, L, Dv, dtype=dtype)
    q = torch.nn.functional.normalize(torch.randn(B, H, L, Dk, dtype=dtype), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(B, H, L, Dk, dtype=dtype), dim=-1)
    alpha = torch.rand(B, H, L, dtype=dtype) * 0.5 + 0.5
    beta = torch.rand(B, H, L, dtype=dtype) * 0.9 + 0.05
    out, state = gated_delta_rule_recurrent(q, k, v, alpha, beta, S)
    for chunk in (lambda *a: ch09_attention_variants._gated_chunk(*a), gated_delta_chunk,
                  chunk_with()):
        got_out, got_state = chunk(S, q, k, v, alpha, beta)
        torch.testing.assert_close(got_out, out, atol=1e-12, rtol=0)
        torch.testing.assert_close(got_state, state, atol=1e-12, rtol=0)


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
    f32 = torch.float32
    assert cache.nbytes == mla_cache_bytes(1, 24, 8, 4, 10, 3, f32, f32)
    assert ch09_attention_variants._mla_bytes(2, 24, 8, 4, 10, 3, f32, f32) == 2 * cache.nbytes


test_wrong_solution_is_rejected_with_the_reason, test_every_checker_knows_at_least_two_mistakes = (
    mistake_tests(WRONG, ch09_attention_variants))
