"""Checkers for the exercises of chapter 9, attention variants
(``chapters/09_attention_variants.ipynb``): the bytes per token of a multi-head latent
attention cache, one step of Gated DeltaNet's recurrence, and a mixture-of-experts layer with
top-k routing and its load-balancing loss.

Each reference here is written out independently of ``transformer_lib.variants``, and each
known mistake is the reference with one thing changed."""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
from torch import Tensor

from transformer_lib.checks._harness import (
    CheckResult,
    _call,
    _compare,
    _compare_number,
    _Failure,
    _generator,
    _items,
    _run,
)
from transformer_lib.ffn import SwiGLU

# The bytes per token of an MLA cache ----------------------------------------------------------


def _mla_bytes(n_layers: int, kv_lora_rank: int, qk_rope_head_dim: int, n_heads: int, T: int,
               batch_size: int, dtype: torch.dtype, *, latents: int = 1, rope_heads: int = 1,
               rope: bool = True, layers: bool = True, batch: bool = True,
               bits: bool = False) -> int:
    """The reference (the defaults) and the mistakes (the other arguments)."""
    size = torch.empty((), dtype=dtype).element_size() * (8 if bits else 1)
    per_layer = latents * kv_lora_rank + (rope_heads * qk_rope_head_dim if rope else 0)
    return (per_layer * (n_layers if layers else 1) * T * (batch_size if batch else 1)
            * size)


_MLA_MISTAKES = [
    (dict(latents=2), "the latent is cached once: keys and values are both rebuilt from the "
                      "same c_kv, so it is not counted twice"),
    (dict(latents=2, rope_heads=2), "the latent and the RoPE key are cached once each: "
                                    "nothing is stored separately for the keys and values"),
    (dict(rope_heads="n_heads"), "the RoPE key is one vector per token, shared by all heads, "
                                 "not one per head"),
    (dict(rope=False), "the cache also holds the RoPE key, qk_rope_head_dim numbers per token "
                       "and layer, next to the latent"),
    (dict(layers=False), "every layer has its own cache: multiply by n_layers"),
    (dict(batch=False), "each of the batch_size sequences has its own cache"),
    (dict(bits=True), "this counts bits: a value of this dtype takes "
                      "torch.empty((), dtype=dtype).element_size() bytes"),
]


def check_mla_cache_bytes(mla_cache_bytes: Callable[..., int]) -> CheckResult:
    """Check ``mla_cache_bytes(n_layers, kv_lora_rank, qk_rope_head_dim, n_heads, T,
    batch_size, dtype) -> int``: the bytes of the multi-head latent attention caches of
    ``batch_size`` sequences of T positions, in a model of ``n_layers`` MLA layers that cache
    a latent of ``kv_lora_rank`` numbers and a RoPE key of ``qk_rope_head_dim`` numbers per
    token, stored in ``dtype``."""

    def case(*args) -> Callable[[], None]:
        names = ["n_layers", "kv_lora_rank", "qk_rope_head_dim", "n_heads", "T",
                 "batch_size", "dtype"]

        def run() -> None:
            got = _call(mla_cache_bytes, list(args), names)
            want = _mla_bytes(*args)
            mistakes = []
            for kwargs, hint in _MLA_MISTAKES:
                kwargs = {k: (args[3] if v == "n_heads" else v) for k, v in kwargs.items()}
                wrong = _mla_bytes(*args, **kwargs)
                if wrong != want:
                    mistakes.append((wrong, hint))
            _compare_number(got, want, "the cache's bytes", rel_tol=0.0, mistakes=mistakes)
        return run

    return _run("mla_cache_bytes", mla_cache_bytes, [
        ("DeepSeek-V3's shape (61 layers, latent 512, RoPE key 64, 128 heads), one token, "
         "bfloat16", case(61, 512, 64, 128, 1, 1, torch.bfloat16)),
        ("a 27-layer model with 16 heads, 32,768 positions, batch 4, float16",
         case(27, 512, 64, 16, 32768, 4, torch.float16)),
        ("2 layers, latent 24, RoPE key 8, 4 heads, 10 positions, batch 3, float32",
         case(2, 24, 8, 4, 10, 3, torch.float32)),
        ("DeepSeek-V3's shape, 4,096 positions, batch 8, one byte per value (float8)",
         case(61, 512, 64, 128, 4096, 8, torch.float8_e4m3fn)),
    ])


# One step of Gated DeltaNet -----------------------------------------------------------------


def _unit(x: Tensor) -> Tensor:
    return x / x.norm(dim=-1, keepdim=True)


def _gated_step(S: Tensor, q: Tensor, k: Tensor, v: Tensor, alpha: Tensor, beta: Tensor, *,
                erase_beta: bool = True, alpha_after: bool = False, decay_error: bool = True,
                transposed: bool = False, read_old: bool = False, norm_k: bool = True,
                norm_q: bool = True) -> tuple[Tensor, Tensor]:
    """The reference (the defaults) and the mistakes (the other arguments), written as
    S_new = α S − α β (S k) kᵀ + β v kᵀ, o = S_new q, with unit q and k."""
    q = _unit(q) if norm_q else q
    k = _unit(k) if norm_k else k
    a, b = alpha[..., None, None], beta[..., None, None]  # (B, H, 1, 1)
    if transposed:  # the state read as (Dk, Dv) and written with k vᵀ
        old = (S * k[..., :, None]).sum(-2)  # (B, H, Dv): kᵀ S
        new = (a * (S - b * k[..., :, None] * old[..., None, :])
               + b * k[..., :, None] * v[..., None, :])  # (B, H, Dk, Dv)
        return new, ((S if read_old else new) * q[..., :, None]).sum(-2)  # (B, H, Dv)
    old = (S * k[..., None, :]).sum(-1)  # (B, H, Dv): S k
    erase = (b if erase_beta else 1.0) * old[..., :, None] * k[..., None, :]  # (B, H, Dv, Dk)
    write = b * v[..., :, None] * k[..., None, :]  # (B, H, Dv, Dk): β v kᵀ
    if alpha_after:
        new = a * (S - erase + write)
    elif decay_error:
        new = a * (S - erase) + write
    else:
        new = a * S - erase + write  # the error measured against the undecayed state
    o = ((S if read_old else new) * q[..., None, :]).sum(-1)  # (B, H, Dv)
    return new, o


_STEP_MISTAKES = [
    (dict(erase_beta=False), "β scales the erase term too: the state keeps 1 − β of the old "
                             "value for k, S (I − β k kᵀ), not S (I − k kᵀ)"),
    (dict(alpha_after=True), "α was applied after the write, so the new value decays too: "
                             "α shrinks the old state only, α S (I − β k kᵀ) + β v kᵀ"),
    (dict(decay_error=False), "the erase term reads the state before it decays: the old "
                              "value for k is α S k, so the term is α β (S k) kᵀ"),
    (dict(transposed=True), "the state maps keys to values, S k ≈ v: it is (Dv, Dk), and "
                            "the write is v kᵀ, not k vᵀ"),
    (dict(read_old=True), "the output reads the state before this token's write: "
                          "o_t = S_t q_t, with the new state"),
    (dict(norm_k=False), "normalise k to unit length before using it: with ‖k‖ > 1, "
                         "I − β k kᵀ can expand the state"),
    (dict(norm_q=False), "normalise q to unit length too"),
]


# Messages of a product whose axes do not fit, and what they mean here.
_SHAPE_ERRORS = ("batch2 tensor", "cannot be multiplied", "must match the size",
                 "size of tensor a", "doesn't match the broadcast shape", "einsum()")
_STATE_HINT = ("the state S is (B, H, Dv, Dk) and maps keys to values: S k is (B, H, Dv), "
               "and the write v kᵀ is (B, H, Dv, Dk)")


def check_gated_delta_step(gated_delta_step: Callable[..., tuple]) -> CheckResult:
    """Check ``gated_delta_step(S, q, k, v, alpha, beta) -> (S_new, o)``: one token of Gated
    DeltaNet, S_new = α S (I − β k kᵀ) + β v kᵀ and o = S_new q, with q and k normalised to
    unit length. S ``(B, H, Dv, Dk)``; q, k ``(B, H, Dk)``; v ``(B, H, Dv)``; alpha, beta
    ``(B, H)``. Returns the new state ``(B, H, Dv, Dk)`` and the output ``(B, H, Dv)``."""
    g = _generator()

    def case(B: int, H: int, Dk: int, Dv: int, *, alpha_one: bool = False) -> Callable[[], None]:
        S = torch.randn(B, H, Dv, Dk, generator=g)
        q, k = 2.0 * torch.randn(B, H, Dk, generator=g), 2.0 * torch.randn(B, H, Dk, generator=g)
        v = torch.randn(B, H, Dv, generator=g)
        alpha = (torch.ones(B, H) if alpha_one
                 else 0.5 + 0.45 * torch.rand(B, H, generator=g))  # (0.5, 0.95)
        beta = 0.2 + 0.7 * torch.rand(B, H, generator=g)  # (0.2, 0.9)
        args = [S, q, k, v, alpha, beta]

        def run() -> None:
            got = _items(_call(gated_delta_step, args, ["S", "q", "k", "v", "alpha", "beta"]),
                         2, "the pair (S_new, o)")
            want = _gated_step(*args)
            wrongs = []
            for kwargs, hint in _STEP_MISTAKES:
                if kwargs.get("transposed") and Dk != Dv:
                    continue  # a transposed state has another shape here
                wrongs.append((_gated_step(*args, **kwargs), hint))
            shape_hints = {(B, H, Dk, Dv): "the state maps keys to values, S k ≈ v: keep it "
                                           "(Dv, Dk), and write v kᵀ, not k vᵀ"}
            _compare(got[0], want[0], "S_new", letters="(B, H, Dv, Dk)",
                     axes=("batch", "head", "value channel", "key channel"),
                     mistakes=[(w[0], hint) for w, hint in wrongs], shape_hints=shape_hints)
            _compare(got[1], want[1], "o", letters="(B, H, Dv)",
                     axes=("batch", "head", "value channel"),
                     mistakes=[(w[1], hint) for w, hint in wrongs])

        def run_with_hints() -> None:
            try:
                run()
            except _Failure as exc:
                if exc.message.startswith("raised") and any(
                        p in exc.message for p in _SHAPE_ERRORS):
                    raise _Failure(exc.message, _STATE_HINT) from None
                raise
        return run_with_hints

    return _run("gated_delta_step", gated_delta_step, [
        ("batch 2, 3 heads, Dk 4, Dv 5", case(2, 3, 4, 5)),
        ("one head, Dk = Dv = 6", case(1, 1, 6, 6)),
        ("α = 1 everywhere: DeltaNet's delta rule, Dk 8, Dv 3", case(2, 2, 8, 3, alpha_one=True)),
    ])


# A mixture of experts: top-k routing and the load-balancing loss ------------------------------


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
    (dict(renormalise=False), "renormalise the k chosen probabilities so that each token's "
                              "gates sum to 1: divide them by their sum"),
    (dict(k_used=1), "each token goes to its top_k experts, not only to the most probable one"),
    (dict(per_token=True), "f_e counts the N·top_k routing slots: divide the counts by "
                           "N·top_k, not by N"),
    (dict(p_from_gates=True), "P_e is the mean router probability of expert e over all "
                              "tokens, from the softmax over every expert, not from the gates"),
    (dict(factor=False), "the loss is n_experts · Σ f_e P_e: 1 for a perfectly balanced "
                         "router"),
]


def check_moe_forward(moe_forward: Callable[..., tuple]) -> CheckResult:
    """Check ``moe_forward(x, router, experts, top_k) -> (out, balance_loss)``: a
    mixture-of-experts layer on tokens ``x`` ``(N, C)``. ``router`` is an ``nn.Linear(C, E)``;
    ``experts`` E modules mapping ``(n, C) -> (n, C)``. Each token goes to the ``top_k``
    experts of highest router probability (softmax of the router's logits), with those
    probabilities renormalised to sum to 1 as gates, and each expert runs only on its tokens.
    ``out`` ``(N, C)``; ``balance_loss`` = E · Σ_e f_e P_e, f_e the fraction of the
    N·top_k routing slots that go to expert e, P_e its mean router probability."""
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
            out, loss = _items(got, 2, "the pair (out, balance_loss)")
            _compare(out, want[0], "out", letters="(N, C)", axes=("token", "channel"),
                     mistakes=[(w[0], hint) for w, hint in wrongs])
            _compare_number(loss, want[1].item(), "the balance loss", rel_tol=1e-5,
                            mistakes=[(w[1].item(), hint) for w, hint in wrongs
                                      if abs(w[1].item() - want[1].item()) > 1e-6])
            if rows != N * top_k:
                raise _Failure(f"the experts ran on {rows} token rows in all, for {N} tokens "
                               f"with top_k = {top_k}: expected {N * top_k}",
                               "run each expert only on the tokens routed to it (gather them "
                               "with an index), not on every token: that is what keeps the "
                               "compute per token at top_k experts")
        return run

    return _run("moe_forward", moe_forward, [
        ("12 tokens, 4 experts, top 2", case(12, 8, 4, 2)),
        ("20 tokens, 8 experts, top 1 (each gate is 1)", case(20, 6, 8, 1)),
        ("9 tokens, 6 experts, top 3", case(9, 8, 6, 3)),
        ("a single token, 5 experts, top 2", case(1, 4, 5, 2)),
    ])
