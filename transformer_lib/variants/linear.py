"""Linear attention, DeltaNet and Gated DeltaNet: attention replaced by a fixed-size state.

Per head, the layer keeps a matrix state ``S`` of shape ``(Dv, Dk)`` that maps a key to a
value (``S k ≈ v``) and is read with a query, ``o_t = S_t q_t``. The three differ in how a
token writes into the state:

    linear attention adds           S_t = S_{t-1} + v_t k_tᵀ
    DeltaNet (delta rule) corrects  S_t = S_{t-1} (I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ
    Gated DeltaNet also forgets     S_t = α_t S_{t-1} (I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ

The delta rule is one gradient step of size β_t on ½‖S k_t − v_t‖²: it moves what the state
returns for ``k_t`` towards ``v_t`` instead of piling a new value on top of the old one.

Each comes in a recurrent form (a loop over tokens: the reference, and how decoding runs)
and a parallel form (linear attention) or chunkwise-parallel form (the delta rules) that
computes the same outputs with matrix products. Every recurrent and chunked function takes
and returns the state, so a sequence can be processed in pieces.

Shapes: q, k ``(B, H, T, Dk)``; v ``(B, H, T, Dv)``; beta, alpha ``(B, H, T)``; state
``(B, H, Dv, Dk)``; outputs ``(B, H, T, Dv)``. Chunked forms cut T into N chunks of L tokens.
Half-precision inputs are computed in fp32 and the results cast back; fp32 and fp64 are
computed in their own dtype. The chunked forms take ``chunk_size`` and ``state`` by keyword.

Conventions, for readers who compare with the flash-linear-attention library (fla): the
queries are not scaled by ``Dk ** -0.5`` (fla scales them by default); the state is
``(Dv, Dk)``, so that it reads ``o = S q`` as in the papers (fla keeps ``(Dk, Dv)``); and the
delta rules L2-normalise q and k inside the function unless ``normalize=False`` (fla leaves
that to the caller by default). DeltaNet's layer puts a SiLU on the projected q and k before
that normalisation; the SiLU belongs to the layer, and these functions leave it out. β and α
are taken in (0, 1]; fla's ``allow_neg_eigval`` lets β reach 2 (negative eigenvalues
1 − β, still non-expansive for unit keys).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from transformer_lib.validation import check_positive, compute_dtype


def _check_inputs(q: Tensor, k: Tensor, v: Tensor, *, beta: Tensor | None = None,
                  alpha: Tensor | None = None, state: Tensor | None = None) -> None:
    """Raise a ValueError naming the values unless the shapes, dtypes and gates are valid."""
    given = {name: x for name, x in
             (("q", q), ("k", k), ("v", v), ("beta", beta), ("alpha", alpha), ("state", state))
             if x is not None}
    for name, x in given.items():
        if not isinstance(x, Tensor) or not x.is_floating_point():
            kind = x.dtype if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"{name} must be a floating-point tensor, got {kind}")
    if len({x.dtype for x in given.values()}) > 1:
        dtypes = ", ".join(f"{name} {x.dtype}" for name, x in given.items())
        raise ValueError(f"inputs must share one dtype, got {dtypes}")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k and v must have 4 dimensions (B, H, T, D), got "
                         f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if q.shape != k.shape:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must have the same shape "
                         "(B, H, T, Dk)")
    if v.shape[:3] != q.shape[:3]:
        raise ValueError(f"v {tuple(v.shape)} must have the same (B, H, T) as q and k "
                         f"{tuple(q.shape)}")
    B, H, T, Dk = q.shape
    Dv = v.shape[-1]
    if T < 1:
        raise ValueError(f"T must be at least 1, got q {tuple(q.shape)}")
    for name, gate in (("beta", beta), ("alpha", alpha)):
        if gate is None:
            continue
        if gate.shape != (B, H, T):
            raise ValueError(f"{name} must have shape (B, H, T) = {(B, H, T)}, "
                             f"got {tuple(gate.shape)}")
        if bool(torch.isnan(gate).any()):
            raise ValueError(f"{name} contains NaN")
        if not bool(((gate > 0) & (gate <= 1)).all()):
            raise ValueError(f"{name} must be in (0, 1], got min {gate.min().item():.4g}, "
                             f"max {gate.max().item():.4g}")
    if state is not None and state.shape != (B, H, Dv, Dk):
        raise ValueError(f"state must have shape (B, H, Dv, Dk) = {(B, H, Dv, Dk)}, "
                         f"got {tuple(state.shape)}")


def _check_chunk_size(chunk_size: int) -> None:
    """Raise a ValueError unless ``chunk_size`` is a positive integer."""
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int):
        raise ValueError(f"chunk_size must be an integer, got {chunk_size!r}")
    check_positive(chunk_size=chunk_size)


def _start(q: Tensor, k: Tensor, v: Tensor, state: Tensor | None,
           normalize: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Cast to the compute dtype, L2-normalise q and k if asked, and make the initial state."""
    dtype = compute_dtype(q.dtype)  # fp16/bf16 -> fp32; fp32 and fp64 stay
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    if normalize:
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)  # unit vectors per head and token
    B, H, _, Dk = q.shape
    if state is None:
        state = q.new_zeros(B, H, v.shape[-1], Dk)  # (B, H, Dv, Dk)
    return q, k, v, state.to(dtype)


# ---- linear attention -------------------------------------------------------------------

def linear_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal linear attention, parallel form: o_t = Σ_{s≤t} (q_t · k_s) v_s.

    That is ``(Q Kᵀ ⊙ lower-triangular) V``: softmax attention with the softmax removed.
    No feature map is applied to q and k and the sum is not normalised (variants apply a
    positive feature map φ and divide by Σ_s φ(q_t)·φ(k_s)); keys are not normalised either.
    Equal to :func:`linear_attention_recurrent`, which never forms the ``(T, T)`` matrix.

    Args:
        q: queries ``(B, H, T, Dk)``.
        k: keys ``(B, H, T, Dk)``.
        v: values ``(B, H, T, Dv)``.

    Returns:
        ``(B, H, T, Dv)``.
    """
    _check_inputs(q, k, v)
    dtype = compute_dtype(q.dtype)  # fp16/bf16 -> fp32; fp32 and fp64 stay
    scores = q.to(dtype) @ k.to(dtype).transpose(-2, -1)  # (B, H, T, T)
    out = scores.tril() @ v.to(dtype)  # (B, H, T, Dv); key s counts for query t iff s <= t
    return out.to(q.dtype)


def linear_attention_recurrent(q: Tensor, k: Tensor, v: Tensor,
                               state: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Linear attention as a recurrence: S_t = S_{t−1} + v_t k_tᵀ, o_t = S_t q_t.

    A state of fixed size ``(Dv, Dk)`` per head replaces the growing KV cache. No feature map,
    no normalisation (as in :func:`linear_attention`, which it equals when ``state`` is None).

    Args:
        q: queries ``(B, H, T, Dk)``.
        k: keys ``(B, H, T, Dk)``.
        v: values ``(B, H, T, Dv)``.
        state: ``(B, H, Dv, Dk)`` to continue from; None means zeros.

    Returns:
        ``(out, state)``: out ``(B, H, T, Dv)`` and the state after the last token
        ``(B, H, Dv, Dk)``, both in the input dtype.
    """
    _check_inputs(q, k, v, state=state)
    dtype = q.dtype
    q, k, v, S = _start(q, k, v, state, normalize=False)
    outs = []
    for t in range(q.shape[2]):
        S = S + v[:, :, t, :, None] * k[:, :, t, None, :]  # (B, H, Dv, Dk): add v_t k_tᵀ
        outs.append(torch.einsum("bhvk,bhk->bhv", S, q[:, :, t]))  # (B, H, Dv)
    return torch.stack(outs, dim=2).to(dtype), S.to(dtype)  # (B, H, T, Dv), (B, H, Dv, Dk)


# ---- the delta rule, one token at a time --------------------------------------------------

def _delta_recurrent(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, alpha: Tensor | None,
                     S: Tensor) -> tuple[Tensor, Tensor]:
    """The (gated) delta rule, token by token, in the compute dtype."""
    outs = []
    for t in range(q.shape[2]):
        if alpha is not None:
            S = alpha[:, :, t, None, None] * S  # (B, H, Dv, Dk): forget a fraction 1 − α_t
        k_t = k[:, :, t]  # (B, H, Dk)
        recalled = torch.einsum("bhvk,bhk->bhv", S, k_t)  # (B, H, Dv): what S holds for k_t
        error = v[:, :, t] - recalled  # (B, H, Dv)
        # S (I − β k kᵀ) + β v kᵀ = S + β (v − S k) kᵀ: replace a fraction β of the old value.
        write = torch.einsum("bhv,bhk->bhvk", error, k_t)  # (B, H, Dv, Dk)
        S = S + beta[:, :, t, None, None] * write  # (B, H, Dv, Dk)
        outs.append(torch.einsum("bhvk,bhk->bhv", S, q[:, :, t]))  # (B, H, Dv)
    return torch.stack(outs, dim=2), S  # (B, H, T, Dv), (B, H, Dv, Dk)


def delta_rule_recurrent(q: Tensor, k: Tensor, v: Tensor, beta: Tensor,
                         state: Tensor | None = None, *,
                         normalize: bool = True) -> tuple[Tensor, Tensor]:
    """DeltaNet's recurrence: S_t = S_{t−1}(I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ, o_t = S_t q_t.

    Equivalently S_t = S_{t−1} − β_t ∇_S ½‖S k_t − v_t‖²: one step of online regression
    from keys to values. The factor I − β k kᵀ has eigenvalue 1 − β‖k‖² along k and 1 in
    every direction orthogonal to it, so it is non-expansive exactly when 0 ≤ β‖k‖² ≤ 2.
    With β‖k‖² > 2 that eigenvalue falls below −1 and the state can grow geometrically;
    normalising the keys makes the condition hold for every β in (0, 1] (and up to β = 2).
    Keys (and queries, as in DeltaNet) are therefore L2-normalised per head and token
    unless ``normalize=False``.

    Args:
        q: queries ``(B, H, T, Dk)``.
        k: keys ``(B, H, T, Dk)``.
        v: values ``(B, H, T, Dv)``.
        beta: writing strengths ``(B, H, T)`` in (0, 1]. β = 1 overwrites what the state held
            for k_t with v_t exactly (S_t k_t = v_t); β = 0 (no write) is not accepted.
        state: ``(B, H, Dv, Dk)`` to continue from; None means zeros.
        normalize: L2-normalise q and k (default). With False the caller guarantees unit
            keys; the update is computed as written for whatever keys it gets.

    Returns:
        ``(out, state)``: out ``(B, H, T, Dv)`` and the state after the last token
        ``(B, H, Dv, Dk)``, both in the input dtype.
    """
    _check_inputs(q, k, v, beta=beta, state=state)
    dtype = q.dtype
    q, k, v, S = _start(q, k, v, state, normalize)
    out, S = _delta_recurrent(q, k, v, beta.to(q.dtype), None, S)
    return out.to(dtype), S.to(dtype)


def gated_delta_rule_recurrent(q: Tensor, k: Tensor, v: Tensor, alpha: Tensor, beta: Tensor,
                               state: Tensor | None = None, *,
                               normalize: bool = True) -> tuple[Tensor, Tensor]:
    """Gated DeltaNet's recurrence: S_t = α_t S_{t−1}(I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ.

    The delta rule (:func:`delta_rule_recurrent`) with a forget gate α_t that shrinks the
    whole state before each write; α ≡ 1 is the delta rule. Keys and queries are
    L2-normalised per head and token unless ``normalize=False`` (see the delta rule).

    Args:
        q: queries ``(B, H, T, Dk)``.
        k: keys ``(B, H, T, Dk)``.
        v: values ``(B, H, T, Dv)``.
        alpha: forget gates ``(B, H, T)`` in (0, 1]; 1 forgets nothing.
        beta: writing strengths ``(B, H, T)`` in (0, 1].
        state: ``(B, H, Dv, Dk)`` to continue from; None means zeros.
        normalize: L2-normalise q and k (default); False: the caller guarantees unit keys.

    Returns:
        ``(out, state)``: out ``(B, H, T, Dv)`` and the state after the last token
        ``(B, H, Dv, Dk)``, both in the input dtype.
    """
    _check_inputs(q, k, v, beta=beta, alpha=alpha, state=state)
    dtype = q.dtype
    q, k, v, S = _start(q, k, v, state, normalize)
    out, S = _delta_recurrent(q, k, v, beta.to(q.dtype), alpha.to(q.dtype), S)
    return out.to(dtype), S.to(dtype)


# ---- the delta rule, a chunk at a time ----------------------------------------------------

def _delta_chunked(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, log_alpha: Tensor,
                   S: Tensor, L: int) -> tuple[Tensor, Tensor]:
    """The gated delta rule, chunkwise-parallel, in the compute dtype (log α = 0: ungated).

    Within a chunk that starts from state S₀, let γ_t = α_1⋯α_t (from the chunk's start) and
    Γ_ts = γ_t / γ_s for s ≤ t (0 above the diagonal). Unrolling the recurrence gives
        S_t = γ_t S₀ + Σ_{s≤t} Γ_ts (u_s − S₀ w_s) k_sᵀ,
    where the vectors w_t (Dk) and u_t (Dv), the rows of W and U, obey
        w_t = β_t (γ_t k_t − Σ_{s<t} Γ_ts (k_s·k_t) w_s),
        u_t = β_t (v_t − Σ_{s<t} Γ_ts (k_s·k_t) u_s),
    i.e. one unit lower-triangular system for both (the UT transform):
        (I + tril(diag(β)(K Kᵀ ⊙ Γ), −1)) [W  U] = diag(β) [diag(γ) K  V].
    (Ungated, γ = Γ = 1 and I − Σ_s w_s k_sᵀ is the WY form of the product of the factors
    I − β_s k_s k_sᵀ.) So a chunk is linear attention with decay Γ on the corrected values
    u_s − S₀ w_s, plus the decayed state's own reading γ_t S₀ q_t.
    """
    B, H, T, Dk = q.shape
    Dv = v.shape[-1]
    N = -(-T // L)  # number of chunks, the last one padded
    pad = N * L - T
    if pad:
        # Padded tokens have q = k = v = 0, β = 0 and α = 1: they leave the state unchanged.
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        beta, log_alpha = F.pad(beta, (0, pad)), F.pad(log_alpha, (0, pad))
    q = q.reshape(B, H, N, L, Dk)  # (B, H, N, L, Dk)
    k = k.reshape(B, H, N, L, Dk)  # (B, H, N, L, Dk)
    v = v.reshape(B, H, N, L, Dv)  # (B, H, N, L, Dv)
    beta = beta.reshape(B, H, N, L)  # (B, H, N, L)
    log_gamma = log_alpha.reshape(B, H, N, L).cumsum(-1)  # (B, H, N, L): log γ_t, in log space
    causal = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()  # (L, L): s <= t
    # Γ_ts = exp(log γ_t − log γ_s) <= 1 for s <= t; above the diagonal −inf gives exactly 0
    # (never exp of a large positive number, whatever α is).
    log_ratio = log_gamma[..., :, None] - log_gamma[..., None, :]  # (B, H, N, L, L)
    decay = log_ratio.masked_fill(~causal, float("-inf")).exp()  # (B, H, N, L, L)
    gamma = log_gamma.exp()  # (B, H, N, L): γ_t
    to_end = (log_gamma[..., -1:] - log_gamma).exp()  # (B, H, N, L): γ_L / γ_t

    # The UT transform for all chunks at once: one triangular solve (forward substitution).
    kk = (k @ k.transpose(-2, -1)) * decay  # (B, H, N, L, L)
    eye = torch.eye(L, dtype=q.dtype, device=q.device)  # (L, L)
    # I + tril(diag(β) (K Kᵀ ⊙ Γ), −1), unit lower-triangular:
    system = beta[..., :, None] * kk.tril(-1) + eye  # (B, H, N, L, L)
    rhs = beta[..., None] * torch.cat([gamma[..., None] * k, v], dim=-1)  # (B, H, N, L, Dk+Dv)
    wu = torch.linalg.solve_triangular(system, rhs, upper=False,
                                       unitriangular=True)  # (B, H, N, L, Dk+Dv)
    w, u = wu.split([Dk, Dv], dim=-1)  # (B, H, N, L, Dk), (B, H, N, L, Dv)
    scores = (q @ k.transpose(-2, -1)) * decay  # (B, H, N, L, L), causal and decayed

    # Chunk to chunk: each chunk reads the state left by the previous one, then updates it.
    outs = []
    for n in range(N):
        new_v = u[:, :, n] - w[:, :, n] @ S.transpose(-2, -1)  # (B, H, L, Dv): u_s − S₀ w_s
        from_state = gamma[:, :, n, :, None] * (q[:, :, n] @ S.transpose(-2, -1))  # (B, H, L, Dv)
        outs.append(from_state + scores[:, :, n] @ new_v)  # (B, H, L, Dv)
        decayed_k = to_end[:, :, n, :, None] * k[:, :, n]  # (B, H, L, Dk)
        written = new_v.transpose(-2, -1) @ decayed_k  # (B, H, Dv, Dk)
        S = gamma[:, :, n, -1, None, None] * S + written  # (B, H, Dv, Dk)
    out = torch.cat(outs, dim=2)[:, :, :T]  # (B, H, T, Dv)
    return out, S


def delta_rule_chunked(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, *, chunk_size: int = 64,
                       state: Tensor | None = None,
                       normalize: bool = True) -> tuple[Tensor, Tensor]:
    """DeltaNet, chunkwise-parallel: the same outputs and state as :func:`delta_rule_recurrent`.

    The chunkwise form of Yang et al. (2024), "Parallelizing Linear Transformers with the
    Delta Rule over Sequence Length". Inside a chunk of L tokens, the product of the factors
    (I − β_s k_s k_sᵀ) is kept in WY form I − Σ_s w_s k_sᵀ; the w_s and the matching values
    u_s come from the UT transform, one unit lower-triangular solve with
    I + tril(diag(β) K Kᵀ, −1). The chunk is then linear attention on the corrected values
    u_s − S₀ w_s (S₀ the state at the chunk's start), and the state passes from chunk to
    chunk: T/L sequential steps of matrix products instead of T steps of vector products.
    When T is not a multiple of ``chunk_size`` the last chunk is padded with tokens that
    leave the state unchanged (k = v = 0, β = 0), and their outputs are dropped.

    Keys and queries are L2-normalised per head and token unless ``normalize=False``
    (keys with β‖k‖² > 2 can make the recurrence diverge; see :func:`delta_rule_recurrent`).

    Args:
        q: queries ``(B, H, T, Dk)``.
        k: keys ``(B, H, T, Dk)``.
        v: values ``(B, H, T, Dv)``.
        beta: writing strengths ``(B, H, T)`` in (0, 1].
        chunk_size: L, tokens per chunk (>= 1); 1 is the recurrence itself.
        state: ``(B, H, Dv, Dk)`` to continue from; None means zeros.
        normalize: L2-normalise q and k (default); False: the caller guarantees unit keys.

    Returns:
        ``(out, state)``: out ``(B, H, T, Dv)`` and the state after the last token
        ``(B, H, Dv, Dk)``, both in the input dtype.
    """
    _check_chunk_size(chunk_size)
    _check_inputs(q, k, v, beta=beta, state=state)
    dtype = q.dtype
    q, k, v, S = _start(q, k, v, state, normalize)
    beta = beta.to(q.dtype)
    out, S = _delta_chunked(q, k, v, beta, torch.zeros_like(beta), S, chunk_size)
    return out.to(dtype), S.to(dtype)


def gated_delta_rule_chunked(q: Tensor, k: Tensor, v: Tensor, alpha: Tensor, beta: Tensor, *,
                             chunk_size: int = 64, state: Tensor | None = None,
                             normalize: bool = True) -> tuple[Tensor, Tensor]:
    """Gated DeltaNet, chunkwise-parallel: equal to :func:`gated_delta_rule_recurrent`.

    The chunked delta rule (:func:`delta_rule_chunked`) with decays: γ_t = α_1⋯α_t from the
    chunk's start is computed as exp(cumsum(log α)), and every ratio γ_t/γ_s (s <= t) as
    exp(log γ_t − log γ_s) <= 1, so small α underflows to 0 and never overflows to inf. The
    last chunk is padded with tokens that leave the state unchanged (k = v = 0, β = 0, α = 1).

    Args:
        q: queries ``(B, H, T, Dk)``.
        k: keys ``(B, H, T, Dk)``.
        v: values ``(B, H, T, Dv)``.
        alpha: forget gates ``(B, H, T)`` in (0, 1].
        beta: writing strengths ``(B, H, T)`` in (0, 1].
        chunk_size: L, tokens per chunk (>= 1).
        state: ``(B, H, Dv, Dk)`` to continue from; None means zeros.
        normalize: L2-normalise q and k (default); False: the caller guarantees unit keys.

    Returns:
        ``(out, state)``: out ``(B, H, T, Dv)`` and the state after the last token
        ``(B, H, Dv, Dk)``, both in the input dtype.
    """
    _check_chunk_size(chunk_size)
    _check_inputs(q, k, v, beta=beta, alpha=alpha, state=state)
    dtype = q.dtype
    q, k, v, S = _start(q, k, v, state, normalize)
    out, S = _delta_chunked(q, k, v, beta.to(q.dtype), alpha.to(q.dtype).log(), S, chunk_size)
    return out.to(dtype), S.to(dtype)
