"""A mixture-of-experts feed-forward layer: a router, top-k gating, a load-balancing loss.

The attention stays as it is; the FFN of a block becomes ``n_experts`` SwiGLU experts, and a
linear *router* picks ``top_k`` of them for each token:

    p = softmax(x W_r)                  router probabilities over the experts (in fp32)
    i_1 … i_k = the k largest p         the chosen experts
    g_j = p_{i_j} / Σ_j p_{i_j}         gates: the chosen probabilities renormalised to sum to 1
    y = Σ_j g_j · Expert_{i_j}(x)

Renormalising the k gates is Mixtral's convention (and Hugging Face's ``norm_topk_prob=True``);
some models skip it (Switch Transformer with k = 1, Qwen-MoE with ``norm_topk_prob=False``),
and then a token's output is scaled by how much probability its chosen experts hold.

Each expert runs only on the tokens routed to it (gather, compute, scatter back with
``index_add``), so the parameters grow with ``n_experts`` while the compute per token grows
only with ``top_k``: an MoE changes capacity, not per-token compute.

Names follow Hugging Face where they exist (``experts.{i}.gate_proj/up_proj/down_proj``);
the router is ``router`` here (HF calls it ``gate``, which the SwiGLU's ``gate_proj`` would
make ambiguous). Shape letters: N = B·T tokens, E = ``n_experts``, k = ``top_k``.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from transformer_lib.ffn import SwiGLU
from transformer_lib.validation import check_bool, check_positive, compute_dtype

__all__ = ["MoEFeedForward", "load_balancing_loss"]


def load_balancing_loss(router_probs: Tensor, expert_index: Tensor, n_experts: int) -> Tensor:
    """Switch Transformer's auxiliary loss: n_experts · Σ_i f_i · P_i.

    f_i is the fraction of token-slots (N·k of them) routed to expert i, P_i the mean router
    probability of expert i over the N tokens. Both sum to 1 over the experts. The loss is
    1.0 when the router probabilities are uniform (P_i = 1/E, whatever f is) and when the load
    is perfectly balanced (f_i = 1/E); it grows towards E as the router collapses onto one
    expert. f comes from an argmax and has no gradient: the loss trains the router through P.
    (Hugging Face's Mixtral divides the counts by N instead of N·k, giving k times this value.)

    Args:
        router_probs: ``(..., E)`` router probabilities (softmax outputs).
        expert_index: ``(..., k)`` chosen experts, integers in ``[0, E - 1]``.
        n_experts: E.

    Returns:
        A scalar tensor in ``router_probs``' dtype.
    """
    check_positive(n_experts=n_experts)
    if router_probs.shape[-1] != n_experts:
        raise ValueError(f"router_probs must have shape (..., {n_experts}), "
                         f"got {tuple(router_probs.shape)}")
    if expert_index.shape[:-1] != router_probs.shape[:-1]:
        raise ValueError(f"expert_index {tuple(expert_index.shape)} and router_probs "
                         f"{tuple(router_probs.shape)} must agree on the token dimensions")
    if expert_index.numel():
        lo, hi = int(expert_index.min()), int(expert_index.max())
        if lo < 0 or hi >= n_experts:
            raise ValueError(
                f"expert_index must be in [0, {n_experts - 1}], got min {lo}, max {hi}"
            )
    slots = F.one_hot(expert_index.reshape(-1), n_experts)  # (N·k, E)
    f = slots.sum(dim=0).to(router_probs.dtype) / slots.shape[0]  # (E,) fraction of slots
    P = router_probs.reshape(-1, n_experts).mean(dim=0)  # (E,) mean probability
    return n_experts * (f * P).sum()


class MoEFeedForward(nn.Module):
    """Top-k mixture of SwiGLU experts with a linear router (no bias).

    ``forward(x)`` returns ``(out, aux_loss)``. With ``keep_weights=True`` (or inside
    ``with transformer_lib.recording.record_weights(layer):``) the last routing is kept for
    plotting: :attr:`last_router_probs` ``(..., E)`` and :attr:`last_expert_index`
    ``(..., k)`` (detached); the load per expert is
    ``torch.bincount(last_expert_index.flatten(), minlength=E)``. By default nothing is kept.
    """

    def __init__(self, d_model: int, d_ff: int, n_experts: int, top_k: int,
                 keep_weights: bool = False):
        super().__init__()
        check_positive(d_model=d_model, d_ff=d_ff, n_experts=n_experts, top_k=top_k)
        if top_k > n_experts:
            raise ValueError(f"top_k ({top_k}) must be <= n_experts ({n_experts})")
        check_bool("keep_weights", keep_weights)
        self.d_model, self.d_ff = d_model, d_ff
        self.n_experts, self.top_k = n_experts, top_k
        self.keep_weights = keep_weights  # keep the last routing for plots
        self.router = nn.Linear(d_model, n_experts, bias=False)
        self.experts = nn.ModuleList([SwiGLU(d_model, d_ff) for _ in range(n_experts)])
        self._routing: tuple[Tensor, Tensor] | None = None  # (probs, expert_index) if kept

    def _kept(self) -> tuple[Tensor, Tensor]:
        """The routing the last forward pass kept, or a RuntimeError saying how to ask."""
        if self._routing is not None:
            return self._routing
        if self.keep_weights:
            raise RuntimeError("no routing yet: run a forward pass first")
        raise RuntimeError("no routing was kept: build the layer with MoEFeedForward(..., "
                           "keep_weights=True), or run it inside `with record_weights(model): "
                           "...` (from transformer_lib.attention)")

    @property
    def last_router_probs(self) -> Tensor:
        """Router probabilities ``(..., E)`` of the last forward pass, if it kept them."""
        return self._kept()[0]

    @property
    def last_expert_index(self) -> Tensor:
        """Chosen experts ``(..., k)`` of the last forward pass, if it kept them."""
        return self._kept()[1]

    @property
    def active_parameters(self) -> int:
        """Parameters that touch one token: the router and ``top_k`` experts
        (C·E + k · 3·C·d_ff), against ``n_experts`` experts in total."""
        router = sum(p.numel() for p in self.router.parameters())
        per_expert = sum(p.numel() for p in self.experts[0].parameters())
        return router + self.top_k * per_expert

    def route(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The router's decision for each token.

        Args:
            x: tokens ``(N, C)``.

        Returns:
            ``(probs, gates, expert_index)``: probabilities ``(N, E)`` (fp32, or fp64 for
            fp64 input), renormalised gates ``(N, k)`` in the same dtype, and the chosen
            experts ``(N, k)``, most probable first.
        """
        logits = self.router(x)  # (N, E)
        probs = torch.softmax(logits.to(compute_dtype(logits.dtype)), dim=-1)  # (N, E), fp32+
        top_probs, expert_index = probs.topk(self.top_k, dim=-1)  # (N, k), (N, k)
        gates = top_probs / top_probs.sum(dim=-1, keepdim=True)  # (N, k), each row sums to 1
        return probs, gates, expert_index

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Route every token to its ``top_k`` experts and sum their outputs, weighted by the gates.

        Args:
            x: ``(B, T, C)`` (any leading dimensions work: ``(..., C)``).

        Returns:
            ``(out, aux_loss)``: out ``(B, T, C)``; aux_loss a scalar (fp32, fp64 for fp64
            input), the :func:`load_balancing_loss` of this routing (add it, scaled by a small
            coefficient such as 0.01, to the training loss).
        """
        if x.dim() < 1 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must have shape (..., {self.d_model}), got {tuple(x.shape)}")
        flat = x.reshape(-1, self.d_model)  # (N, C)
        probs, gates, expert_index = self.route(flat)  # (N, E), (N, k), (N, k)
        gates = gates.to(x.dtype)
        out = torch.zeros_like(flat)  # (N, C)
        for e, expert in enumerate(self.experts):
            token, slot = (expert_index == e).nonzero(as_tuple=True)  # (n_e,), (n_e,)
            if token.numel() == 0:
                continue  # no token chose this expert
            y = expert(flat[token])  # (n_e, C): only the tokens routed here
            out = out.index_add(0, token, y * gates[token, slot, None])  # (N, C)
        self._routing = None  # kept only on request
        if self.keep_weights:
            self._routing = (probs.detach().reshape(*x.shape[:-1], self.n_experts),  # (..., E)
                             expert_index.reshape(*x.shape[:-1], self.top_k))  # (..., k)
        aux_loss = load_balancing_loss(probs, expert_index, self.n_experts)
        return out.reshape(x.shape), aux_loss
