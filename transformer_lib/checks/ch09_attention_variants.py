"""Checkers for the exercises of chapter 9, attention variants
(``chapters/09_attention_variants.ipynb``): the bytes of a multi-head latent attention cache
stored in two dtypes, one chunk of Gated DeltaNet through the UT transform, and a
mixture-of-experts layer with top-k routing and its load-balancing loss.

Each reference here is written out independently of ``transformer_lib.variants``, and each
known mistake is the reference with one thing changed."""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
from torch import Tensor

from transformer_lib.checks._guard import Rules, given
from transformer_lib.checks._harness import (
    CheckResult,
    _call,
    _compare,
    _compare_number,
    _Failure,
    _fixed_work,
    _generator,
    _items,
    _known_mistakes,
    _run,
)
from transformer_lib.checks._messages import say
from transformer_lib.ffn import SwiGLU

#: What the student's code may call in each exercise: exercise function -> its
#: :class:`~transformer_lib.checks.Rules` (enforced by the guard while the function runs).
RULES = {
    "mla_cache_bytes": Rules(),
    "gated_delta_chunk": Rules(),
    "moe_forward": Rules(),
}

# The bytes per token of an MLA cache ----------------------------------------------------------


def _mla_bytes(n_layers: int, kv_lora_rank: int, qk_rope_head_dim: int, n_heads: int, T: int,
               batch_size: int, latent_dtype: torch.dtype, rope_dtype: torch.dtype, *,
               latents: int = 1, rope_heads: int = 1, rope: bool = True, layers: bool = True,
               batch: bool = True, bits: bool = False, one_dtype: str | None = None) -> int:
    """The reference (the defaults) and the mistakes (the other arguments)."""
    if one_dtype is not None:  # both parts stored in one of the two dtypes
        latent_dtype = rope_dtype = latent_dtype if one_dtype == "latent" else rope_dtype
    scale = 8 if bits else 1
    latent_size = torch.empty((), dtype=latent_dtype).element_size() * scale
    rope_size = torch.empty((), dtype=rope_dtype).element_size() * scale
    per_layer = (latents * kv_lora_rank * latent_size
                 + (rope_heads * qk_rope_head_dim * rope_size if rope else 0))
    return per_layer * (n_layers if layers else 1) * T * (batch_size if batch else 1)


_MLA_MISTAKES = [
    (dict(latents=2), say("the latent is cached once: keys and values are both rebuilt from the "
                          "same c_kv, so it is not counted twice")),
    (dict(latents=2, rope_heads=2), say("the latent and the RoPE key are cached once each: "
                                        "nothing is stored separately for the keys and values")),
    (dict(rope_heads="n_heads"), say("the RoPE key is one vector per token, shared by all heads, "
                                     "not one per head")),
    (dict(rope=False), say("the cache also holds the RoPE key, qk_rope_head_dim numbers per token "
                           "and layer, next to the latent")),
    (dict(layers=False), say("every layer has its own cache: multiply by n_layers")),
    (dict(batch=False), say("each of the batch_size sequences has its own cache")),
    (dict(bits=True), say("this counts bits: a value of this dtype takes "
                          "torch.empty((), dtype=dtype).element_size() bytes")),
    (dict(one_dtype="latent"), say("the RoPE key has its own dtype, rope_dtype: count its bytes "
                                   "with that dtype's size, not the latent's")),
    (dict(one_dtype="rope"), say("the latent is stored in latent_dtype: count its bytes with "
                                 "that dtype's size, not the RoPE key's")),
]


def check_mla_cache_bytes(mla_cache_bytes: Callable[..., int]) -> CheckResult:
    """Check ``mla_cache_bytes(n_layers, kv_lora_rank, qk_rope_head_dim, n_heads, T,
    batch_size, latent_dtype, rope_dtype) -> int``: the bytes of the multi-head latent
    attention caches of ``batch_size`` sequences of T positions, in a model of ``n_layers``
    MLA layers that cache a latent of ``kv_lora_rank`` numbers stored in ``latent_dtype`` and
    a RoPE key of ``qk_rope_head_dim`` numbers stored in ``rope_dtype`` per token.

    Args:
        mla_cache_bytes: the function to check (the exercise's), called on the checker's own
            inputs.

    Returns:
        A :class:`~transformer_lib.checks.CheckResult`, truthy when every check passed;
        its report is printed.
    """
    names = ["n_layers", "kv_lora_rank", "qk_rope_head_dim", "n_heads", "T", "batch_size",
             "latent_dtype", "rope_dtype"]

    def case(*args) -> Callable[[], None]:
        def run() -> None:
            got = _call(mla_cache_bytes, list(args), names)
            want = _mla_bytes(*args)
            mistakes = _known_mistakes(_mla_bytes, args, names, _MLA_MISTAKES)
            _compare_number(got, want, say("the cache's bytes"), rel_tol=0.0, mistakes=mistakes)
        return run

    bf16, f8 = torch.bfloat16, torch.float8_e4m3fn
    return _run("mla_cache_bytes", mla_cache_bytes, [
        (say("DeepSeek-V3's shape (61 layers, latent 512, RoPE key 64, 128 heads), one token, "
             "bfloat16 throughout"), case(61, 512, 64, 128, 1, 1, bf16, bf16)),
        (say("the same, latent in float8 and RoPE key in bfloat16"),
         case(61, 512, 64, 128, 1, 1, f8, bf16)),
        (say("a 27-layer model with 16 heads, 32,768 positions, batch 4, float16"),
         case(27, 512, 64, 16, 32768, 4, torch.float16, torch.float16)),
        (say("2 layers, latent 24 in float32, RoPE key 8 in float16, 4 heads, 10 positions, "
             "batch 3"), case(2, 24, 8, 4, 10, 3, torch.float32, torch.float16)),
        (say("DeepSeek-V3's shape, 4,096 positions, batch 8, float8 latent, bfloat16 RoPE key"),
         case(61, 512, 64, 128, 4096, 8, f8, bf16)),
    ], rules=RULES["mla_cache_bytes"])


# One chunk of Gated DeltaNet through the UT transform -----------------------------------------

def _gated_chunk(S: Tensor, q: Tensor, k: Tensor, v: Tensor, alpha: Tensor, beta: Tensor, *,
                 gamma_in_system: bool = True, gamma_on_keys: bool = True,
                 solve: bool = True, beta_rows: bool = True, decay_read: bool = True,
                 to_end: bool = True, decay_state: bool = True, diagonal: bool = True,
                 correct: bool = True) -> tuple[Tensor, Tensor]:
    """The reference (the defaults) and the mistakes (the other arguments), written out:
    γ_t = α_1⋯α_t, Γ_ts = γ_t / γ_s (s <= t), A = I + tril(diag(β)(K Kᵀ ⊙ Γ), −1),
    A [W U] = diag(β)[diag(γ) K  V], Ũ = U − W S₀ᵀ, O = diag(γ) Q S₀ᵀ + (Q Kᵀ ⊙ Γ) Ũ,
    S_new = γ_L S₀ + Ũᵀ diag(γ_L / γ) K."""
    L = q.shape[-2]
    log_gamma = alpha.log().cumsum(-1)  # (B, H, L)
    lower = torch.ones(L, L, dtype=torch.bool).tril()  # (L, L): s <= t
    ratio = (log_gamma[..., :, None] - log_gamma[..., None, :]).masked_fill(~lower, -torch.inf)
    Gamma = ratio.exp()  # (B, H, L, L)
    gamma = log_gamma.exp()  # (B, H, L)
    kk = k @ k.transpose(-2, -1) * (Gamma if gamma_in_system else 1.0)  # (B, H, L, L)
    weighted = beta[..., :, None] * kk if beta_rows else kk * beta[..., None, :]
    A = torch.eye(L, dtype=q.dtype) + (weighted.tril(-1) if solve else 0 * weighted)
    rhs = torch.cat([(gamma[..., None] if gamma_on_keys else 1.0) * k, v], dim=-1)
    wu = torch.linalg.solve_triangular(A, beta[..., None] * rhs, upper=False,
                                       unitriangular=True)  # (B, H, L, Dk + Dv)
    w, u = wu.split([k.shape[-1], v.shape[-1]], dim=-1)
    new_v = u - w @ S.transpose(-2, -1) if correct else u  # (B, H, L, Dv)
    scores = (q @ k.transpose(-2, -1)) * Gamma  # (B, H, L, L)
    if not diagonal:
        scores = scores.tril(-1)
    read = q @ S.transpose(-2, -1)  # (B, H, L, Dv): S₀ q_t
    out = (gamma[..., None] if decay_read else 1.0) * read + scores @ new_v
    end = (log_gamma[..., -1:] - log_gamma).exp() if to_end else torch.ones_like(gamma)
    S_new = ((gamma[..., -1, None, None] if decay_state else 1.0) * S
             + new_v.transpose(-2, -1) @ (end[..., None] * k))  # (B, H, Dv, Dk)
    return out, S_new


_CHUNK_MISTAKES = [
    (dict(solve=False), say("w and u are not β k and β v: each also subtracts what the earlier "
                            "tokens of the chunk wrote for its key; solve the unit "
                            "lower-triangular system I + tril(diag(β)(K Kᵀ ⊙ Γ), −1)")),
    (dict(gamma_in_system=False), say("the decays enter the triangular system too: its entries "
                                      "are β_t Γ_ts (k_s · k_t), not β_t (k_s · k_t)")),
    (dict(gamma_on_keys=False), say("w_t carries the decay from the chunk's start: the "
                                    "right-hand side for W is β_t γ_t k_t (for U it is β_t v_t)")),
    (dict(beta_rows=False), say("β_t scales row t of the system (the token being written), "
                                "diag(β) on the left, not the columns")),
    (dict(correct=False), say("the values a chunk writes are corrected by what the starting "
                              "state already returns: u_s − S₀ w_s")),
    (dict(decay_read=False), say("token t reads the starting state after it has decayed by "
                                 "γ_t = α_1⋯α_t: γ_t S₀ q_t")),
    (dict(diagonal=False), say("token t's own write counts for its output (o_t = S_t q_t): keep "
                               "the diagonal of the causal mask")),
    (dict(to_end=False), say("a write at token s has decayed by γ_L / γ_s at the chunk's end: "
                             "scale k_s by it in the new state")),
    (dict(decay_state=False), say("the starting state decays over the whole chunk: γ_L S₀ in "
                                  "the new state")),
]


def check_gated_delta_chunk(gated_delta_chunk: Callable[..., tuple]) -> CheckResult:
    """Check ``gated_delta_chunk(S, q, k, v, alpha, beta) -> (out, S_new)``: one chunk of L
    tokens of Gated DeltaNet, S_t = α_t S_{t−1}(I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ, o_t = S_t q_t,
    computed with matrix products and one triangular solve (the UT transform), without the
    library's delta-rule functions. S ``(B, H, Dv, Dk)``, the state before the chunk; q, k
    ``(B, H, L, Dk)`` unit vectors; v ``(B, H, L, Dv)``; alpha, beta ``(B, H, L)``. Returns
    out ``(B, H, L, Dv)`` and the state after the chunk ``(B, H, Dv, Dk)``.

    Args:
        gated_delta_chunk: the function to check (the exercise's), called on the checker's own
            inputs.

    Returns:
        A :class:`~transformer_lib.checks.CheckResult`, truthy when every check passed;
        its report is printed.
    """
    g = _generator()

    def case(B: int, H: int, L: int, Dk: int, Dv: int, *, zero_state: bool = False,
             alpha_one: bool = False) -> Callable[[], None]:
        dtype = torch.float64
        S = torch.zeros(B, H, Dv, Dk, dtype=dtype) if zero_state else torch.randn(
            B, H, Dv, Dk, generator=g, dtype=dtype)
        q = _unit(torch.randn(B, H, L, Dk, generator=g, dtype=dtype))
        k = _unit(torch.randn(B, H, L, Dk, generator=g, dtype=dtype))
        v = torch.randn(B, H, L, Dv, generator=g, dtype=dtype)
        alpha = (torch.ones(B, H, L, dtype=dtype) if alpha_one
                 else 0.5 + 0.45 * torch.rand(B, H, L, generator=g, dtype=dtype))
        beta = 0.1 + 0.8 * torch.rand(B, H, L, generator=g, dtype=dtype)
        args = [S, q, k, v, alpha, beta]

        def run() -> None:
            got = _items(_call(gated_delta_chunk, args, ["S", "q", "k", "v", "alpha", "beta"],
                               ), 2, say("the pair (out, S_new)"))
            want = _gated_chunk(*args)
            wrongs = [(_gated_chunk(*args, **kwargs), hint) for kwargs, hint in _CHUNK_MISTAKES]
            _compare(got[0], want[0], "out", letters=say("(B, H, L, Dv)"),
                     axes=("batch", "head", "token", say("value channel")), atol=1e-9, rtol=1e-9,
                     mistakes=[(w[0], hint) for w, hint in wrongs])
            _compare(got[1], want[1], "S_new", letters=say("(B, H, Dv, Dk)"),
                     axes=("batch", "head", say("value channel"), say("key channel")), atol=1e-9,
                     rtol=1e-9, mistakes=[(w[1], hint) for w, hint in wrongs],
                     shape_hints={(B, H, Dk, Dv): say("the state maps keys to values: keep it "
                                                      "(Dv, Dk)")})
        return run

    def fixed_work() -> None:
        def inputs(L: int) -> list:
            dtype = torch.float64
            return [torch.randn(1, 2, 3, 4, generator=g, dtype=dtype),
                    _unit(torch.randn(1, 2, L, 4, generator=g, dtype=dtype)),
                    _unit(torch.randn(1, 2, L, 4, generator=g, dtype=dtype)),
                    torch.randn(1, 2, L, 3, generator=g, dtype=dtype),
                    0.5 + 0.45 * torch.rand(1, 2, L, generator=g, dtype=dtype),
                    0.1 + 0.8 * torch.rand(1, 2, L, generator=g, dtype=dtype)]
        _fixed_work(gated_delta_chunk, inputs(6), inputs(12),
                    ["S", "q", "k", "v", "alpha", "beta"], "chunk",
                    (say("a chunk of 6 tokens"), say("a chunk of 12 tokens")))

    return _run("gated_delta_chunk", gated_delta_chunk, [
        (say("batch 2, 3 heads, a chunk of 8 tokens, Dk 6, Dv 5, a random starting state"),
         case(2, 3, 8, 6, 5)),
        (say("one head, 16 tokens (more than Dk = 4), Dv 3"), case(1, 1, 16, 4, 3)),
        (say("α = 1 (DeltaNet), 6 tokens, from a zero state"),
         case(2, 2, 6, 5, 5, zero_state=True, alpha_one=True)),
        (say("a chunk of one token"), case(1, 2, 1, 4, 4)),
        (say("the work does not grow with the length of the chunk"), fixed_work),
    ], rules=RULES["gated_delta_chunk"])


def _unit(x: Tensor) -> Tensor:
    return x / x.norm(dim=-1, keepdim=True)


# A mixture of experts: top-k routing and the load-balancing loss ------------------------------


@given
class _CountingExpert(nn.Module):
    """A SwiGLU expert that counts the token rows it is run on."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.ffn = SwiGLU(d_model, d_ff)
        self.rows = 0

    def forward(self, x: Tensor) -> Tensor:
        self.rows += x.reshape(-1, x.shape[-1]).shape[0]
        return self.ffn(x)


def _moe(x: Tensor, router: nn.Linear, experts, top_k: int, *, renormalise: bool = True,
         k_used: int | None = None, per_token: bool = False, p_from_gates: bool = False,
         factor: bool = True) -> tuple[Tensor, Tensor]:
    """The reference (the defaults) and the mistakes (the other arguments): every expert on
    every token, weighted by a dense (N, E) matrix of gates that is zero off the top k."""
    E = len(experts)
    k = top_k if k_used is None else k_used
    probs = torch.softmax(router(x), dim=-1)  # (N, E)
    top, index = probs.topk(k, dim=-1)  # (N, k)
    gates = top / top.sum(dim=-1, keepdim=True) if renormalise else top
    dense = torch.zeros_like(probs).scatter(1, index, gates)  # (N, E)
    outputs = torch.stack([expert.ffn(x) for expert in experts], dim=1)  # (N, E, C)
    out = (dense[..., None] * outputs).sum(dim=1)  # (N, C)
    counts = torch.zeros(E).index_add(0, index.reshape(-1), torch.ones(index.numel()))
    f = counts / (x.shape[0] if per_token else index.numel())  # (E,)
    P = (dense if p_from_gates else probs).mean(dim=0)  # (E,)
    loss = (E if factor else 1) * (f * P).sum()
    return out, loss


_MOE_MISTAKES = [
    (dict(renormalise=False), say("renormalise the k chosen probabilities so that each token's "
                                  "gates sum to 1: divide them by their sum")),
    (dict(k_used=1),
     say("each token goes to its top_k experts, not only to the most probable one")),
    (dict(per_token=True), say("f_e counts the N·top_k routing slots: divide the counts by "
                               "N·top_k, not by N")),
    (dict(p_from_gates=True),
     say("P_e is the mean router probability of expert e over all tokens, from the softmax over "
         "every expert, not from the gates")),
    (dict(factor=False), say("the loss is n_experts · Σ f_e P_e: 1 for a perfectly balanced "
                             "router")),
]


def check_moe_forward(moe_forward: Callable[..., tuple]) -> CheckResult:
    """Check ``moe_forward(x, router, experts, top_k) -> (out, balance_loss)``: a
    mixture-of-experts layer on tokens ``x`` ``(N, C)``. ``router`` is an ``nn.Linear(C, E)``;
    ``experts`` E modules mapping ``(n, C) -> (n, C)``. Each token goes to the ``top_k``
    experts of highest router probability (softmax of the router's logits), with those
    probabilities renormalised to sum to 1 as gates, and each expert runs only on its tokens.
    ``out`` ``(N, C)``; ``balance_loss`` = E · Σ_e f_e P_e, f_e the fraction of the
    N·top_k routing slots that go to expert e, P_e its mean router probability.

    Args:
        moe_forward: the function to check (the exercise's), called on the checker's own
            inputs.

    Returns:
        A :class:`~transformer_lib.checks.CheckResult`, truthy when every check passed;
        its report is printed.
    """
    g = _generator()

    def case(N: int, C: int, E: int, top_k: int) -> Callable[[], None]:
        with torch.random.fork_rng():
            torch.manual_seed(int(torch.randint(0, 2 ** 31, (1,), generator=g)))
            router = nn.Linear(C, E, bias=False)
            experts = nn.ModuleList([_CountingExpert(C, 2 * C) for _ in range(E)])
        with torch.no_grad():
            router.weight.copy_(torch.randn(E, C, generator=g))
            for p in experts.parameters():
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
        x = torch.randn(N, C, generator=g)

        def run() -> None:
            for expert in experts:
                expert.rows = 0
            with torch.no_grad():
                got = _call(moe_forward, [x, router, experts, top_k],
                            ["x", "router", "experts", "top_k"])
                rows = sum(expert.rows for expert in experts)
                want = _moe(x, router, experts, top_k)
                wrongs = [(_moe(x, router, experts, top_k, **kw), hint)
                          for kw, hint in _MOE_MISTAKES]
            out, loss = _items(got, 2, say("the pair (out, balance_loss)"))
            _compare(out, want[0], "out", letters=say("(N, C)"), axes=("token", "channel"),
                     mistakes=[(w[0], hint) for w, hint in wrongs])
            _compare_number(loss, want[1].item(), say("the balance loss"), rel_tol=1e-5,
                            mistakes=[(w[1].item(), hint) for w, hint in wrongs
                                      if abs(w[1].item() - want[1].item()) > 1e-6])
            if rows != N * top_k:
                raise _Failure(say("the experts ran on {rows} token rows in all, for {N} tokens "
                                   "with top_k = {top_k}: expected {expected}", rows=rows, N=N,
                                   top_k=top_k, expected=N * top_k),
                               say("run each expert only on the tokens routed to it (gather them "
                                   "with an index), not on every token: that is what keeps the "
                                   "compute per token at top_k experts"))
        return run

    return _run("moe_forward", moe_forward, [
        (say("12 tokens, 4 experts, top 2"), case(12, 8, 4, 2)),
        (say("20 tokens, 8 experts, top 1 (each gate is 1)"), case(20, 6, 8, 1)),
        (say("9 tokens, 6 experts, top 3"), case(9, 8, 6, 3)),
        (say("a single token, 5 experts, top 2"), case(1, 4, 5, 2)),
    ], rules=RULES["moe_forward"])
