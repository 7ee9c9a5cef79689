"""Associative recall: what a growing cache keeps and a fixed-size state forgets.

The task: a sequence presents N key–value pairs, then asks for the value of each stored key.
Here the keys and values are random unit vectors (no model is trained): the pairs are written
into each kind of memory by its own rule, and each stored key is then used as a query.

- **softmax attention** keeps every key and value (a KV cache of N positions) and reads with
  a sharp softmax over the stored keys;
- **linear attention** adds every pair into a ``(Dv, Dk)`` state, ``S += v kᵀ``;
- **the delta rule** writes each pair with β = 1, replacing what the state returned for the
  key (:func:`~transformer_lib.variants.linear.delta_rule_recurrent`); reading the pairs
  several times ("passes") repeats the online regression;
- **the best fixed state** is the least-squares map from the keys to the values: no
  ``(Dv, Dk)`` state read as ``S k`` returns the N values with a smaller total squared error.

A state read linearly can return N arbitrary values exactly only if it solves N·Dv equations
with Dv·Dk unknowns, which random keys allow for N ≤ Dk and never for N > Dk: the state's
size is its capacity. The KV cache has no such limit, and grows with N instead.

Shapes: keys ``(B, N, Dk)``, values ``(B, N, Dv)``, outputs ``(B, N, Dv)``; B independent
trials.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from transformer_lib.validation import check_positive
from transformer_lib.variants.linear import delta_rule_recurrent, linear_attention_recurrent


def recall_pairs(trials: int, n_pairs: int, d_key: int, d_value: int, *,
                 generator: torch.Generator | None = None,
                 dtype: torch.dtype = torch.float64) -> tuple[Tensor, Tensor]:
    """Random unit keys and values for ``trials`` independent recall problems.

    Args:
        trials: B, independent sets of pairs.
        n_pairs: N, pairs in each set.
        d_key, d_value: Dk and Dv.
        generator: the random stream (default: torch's global one).
        dtype: the dtype of the vectors.

    Returns:
        ``(keys, values)``: ``(B, N, Dk)`` and ``(B, N, Dv)``, every row of unit length.
    """
    check_positive(trials=trials, n_pairs=n_pairs, d_key=d_key, d_value=d_value)
    keys = torch.randn(trials, n_pairs, d_key, generator=generator, dtype=dtype)
    values = torch.randn(trials, n_pairs, d_value, generator=generator, dtype=dtype)
    return F.normalize(keys, dim=-1), F.normalize(values, dim=-1)


def _read(state: Tensor, keys: Tensor) -> Tensor:
    """``S k`` for every key: state ``(B, 1, Dv, Dk)``, keys ``(B, N, Dk)`` -> ``(B, N, Dv)``."""
    return torch.einsum("bvk,bnk->bnv", state[:, 0], keys)


def recall(keys: Tensor, values: Tensor, method: str, *, scale: float = 30.0,
           passes: int = 1) -> Tensor:
    """Write the pairs into one kind of memory, then read it with every stored key.

    Args:
        keys: ``(B, N, Dk)`` unit keys.
        values: ``(B, N, Dv)``.
        method: ``"softmax"`` (a KV cache read with softmax(scale · K q)), ``"linear"``
            (linear attention's state), ``"delta"`` (the delta rule with β = 1, ``passes``
            times over the pairs) or ``"least_squares"`` (the best fixed state).
        scale: the softmax's inverse temperature (``"softmax"`` only). Keys of unit length
            score 1 against themselves; a sharp scale makes that score win.
        passes: how many times the delta rule reads the pairs (``"delta"`` only).

    Returns:
        ``(B, N, Dv)``: what the memory returns for each stored key.
    """
    check_positive(passes=passes)
    for name, t in (("keys", keys), ("values", values)):
        if not isinstance(t, Tensor) or t.dim() != 3:
            got = f"shape {tuple(t.shape)}" if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a (B, N, D) tensor (B trials of N pairs), got {got}")
    B, N, _ = keys.shape
    if values.shape[:2] != (B, N):
        raise ValueError(f"keys {tuple(keys.shape)} and values {tuple(values.shape)} must "
                         "have the same (B, N)")
    if method == "softmax":
        scores = scale * keys @ keys.transpose(-2, -1)  # (B, N, N): every query, every key
        return scores.softmax(dim=-1) @ values  # (B, N, Dv)
    q, k, v = keys[:, None], keys[:, None], values[:, None]  # (B, 1, N, D): one head
    if method == "linear":
        _, state = linear_attention_recurrent(q, k, v)  # (B, 1, Dv, Dk)
        return _read(state, keys)
    if method == "delta":
        beta = torch.ones(B, 1, N, dtype=keys.dtype, device=keys.device)  # (B, 1, N): S k_t = v_t
        state = None
        for _ in range(passes):
            _, state = delta_rule_recurrent(q, k, v, beta, state)  # (B, 1, Dv, Dk)
        return _read(state, keys)
    if method == "least_squares":
        # min ‖K X − V‖ (the smallest such X when several fit); pinv, unlike lstsq, solves
        # N < Dk on every device
        best = torch.linalg.pinv(keys) @ values  # (B, Dk, N) @ (B, N, Dv) -> (B, Dk, Dv)
        return keys @ best  # (B, N, Dv)
    raise ValueError(f"method must be 'softmax', 'linear', 'delta' or 'least_squares', "
                     f"got {method!r}")


def retrieval_error(outputs: Tensor, values: Tensor) -> float:
    """The mean distance ‖o − v‖ between what was read and what was stored (values of unit
    length: 0 is perfect recall, 1 is as far as returning nothing)."""
    return (outputs - values).norm(dim=-1).mean().item()


def recall_accuracy(outputs: Tensor, values: Tensor) -> float:
    """The fraction of queries whose output is closest (largest dot product) to the right one
    of the N stored values."""
    scores = outputs @ values.transpose(-2, -1)  # (B, N, N): each output against each value
    right = torch.arange(values.shape[1], device=values.device)
    return (scores.argmax(dim=-1) == right).double().mean().item()


def recall_sweep(n_pairs: Sequence[int], d_key: int = 32, d_value: int = 32, *,
                 trials: int = 20, seed: int = 0, scale: float = 30.0,
                 passes: int = 4) -> dict:
    """Retrieval error and accuracy of five memories against N: softmax attention, linear
    attention, the delta rule (one pass, and ``passes`` passes) and the best fixed state.

    Args:
        n_pairs: the numbers of pairs N to try.
        d_key, d_value: Dk and Dv: a state holds Dv·Dk numbers.
        trials: independent sets of pairs per N (the results are their means).
        seed: seeds the pairs; each N draws new pairs from one stream.
        scale: the softmax's inverse temperature.
        passes: the passes of the second delta-rule memory.

    Returns:
        A dict: ``"n_pairs"`` (the N), ``"error"`` and ``"accuracy"`` (memory -> array, one
        value per N; memories in the order above, the fourth named
        ``"delta rule, <passes> passes"``), ``"state_numbers"`` (Dv·Dk) and
        ``"cache_numbers"`` (N·(Dk + Dv) per N, what the softmax memory keeps).
    """
    generator = torch.Generator().manual_seed(seed)
    runs = {"softmax attention": dict(method="softmax", scale=scale),
            "linear attention": dict(method="linear"),
            "delta rule": dict(method="delta"),
            f"delta rule, {passes} passes": dict(method="delta", passes=passes),
            "best fixed state": dict(method="least_squares")}
    error = {name: [] for name in runs}
    accuracy = {name: [] for name in runs}
    for n in n_pairs:
        keys, values = recall_pairs(trials, n, d_key, d_value, generator=generator)
        for name, kwargs in runs.items():
            out = recall(keys, values, **kwargs)
            error[name].append(retrieval_error(out, values))
            accuracy[name].append(recall_accuracy(out, values))
    return {"n_pairs": list(n_pairs),
            "error": {name: np.array(e) for name, e in error.items()},
            "accuracy": {name: np.array(a) for name, a in accuracy.items()},
            "state_numbers": d_key * d_value,
            "cache_numbers": [n * (d_key + d_value) for n in n_pairs]}
