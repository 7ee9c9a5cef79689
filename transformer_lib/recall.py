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
  ``(Dv, Dk)`` state read as ``S k`` returns the N values with a smaller total squared error;
- **Gated DeltaNet** writes like the delta rule but shrinks the state by a constant forget
  gate α before each write (:func:`~transformer_lib.variants.linear.gated_delta_rule_recurrent`);
- **a sliding window** is softmax attention over the last W pairs only (a cache of W
  positions).

The last two trade old pairs for recent ones, so :func:`recall_by_age` splits the accuracy
and the error between the most recent pairs and the older ones (:func:`recall_age_sweep`).

A state read linearly can return N arbitrary values exactly only if it solves N·Dv equations
with Dv·Dk unknowns, which random keys allow for N ≤ Dk and never for N > Dk: the state's
size is its capacity. The KV cache has no such limit, and grows with N instead.

Chapter 7 uses the last part, :func:`shared_kv_recall`: items that carry one attribute per
query head, recalled through one trained attention layer whose query heads share ``H_kv``
key/value heads; what sharing costs is what the cached values can no longer hold.

Shapes: keys ``(B, N, Dk)``, values ``(B, N, Dv)``, outputs ``(B, N, Dv)``; B independent
trials.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from transformer_lib.attention import MultiHeadAttention
from transformer_lib.resources import load_json
from transformer_lib.validation import check_positive
from transformer_lib.variants.linear import (
    delta_rule_recurrent,
    gated_delta_rule_recurrent,
    linear_attention_recurrent,
)


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
           passes: int = 1, alpha: float = 0.95, window: int = 16) -> Tensor:
    """Write the pairs into one kind of memory, then read it with every stored key.

    Args:
        keys: ``(B, N, Dk)`` unit keys.
        values: ``(B, N, Dv)``.
        method: ``"softmax"`` (a KV cache read with softmax(scale · K q)), ``"linear"``
            (linear attention's state), ``"delta"`` (the delta rule with β = 1, ``passes``
            times over the pairs), ``"least_squares"`` (the best fixed state), ``"gated"``
            (Gated DeltaNet, β = 1 and a constant forget gate ``alpha``) or ``"window"``
            (softmax attention over the last ``window`` pairs).
        scale: the softmax's inverse temperature (``"softmax"`` and ``"window"``). Keys of
            unit length score 1 against themselves; a sharp scale makes that score win (30 is
            set by hand: with the usual ``1/sqrt(Dk)`` the softmax is nearly flat).
        passes: how many times the delta rule reads the pairs (``"delta"`` only).
        alpha: the forget gate in (0, 1] (``"gated"`` only).
        window: W, the pairs a sliding window keeps (``"window"`` only).

    Returns:
        ``(B, N, Dv)``: what the memory returns for each stored key.
    """
    check_positive(passes=passes, window=window)
    if not 0 < alpha <= 1:
        raise ValueError(f"alpha must be in (0, 1], got {alpha}")
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
    if method == "window":
        scores = scale * keys @ keys[:, -window:].transpose(-2, -1)  # (B, N, min(W, N))
        return scores.softmax(dim=-1) @ values[:, -window:]  # (B, N, Dv): the last W only
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
    if method == "gated":
        ones = torch.ones(B, 1, N, dtype=keys.dtype, device=keys.device)  # (B, 1, N)
        _, state = gated_delta_rule_recurrent(q, k, v, alpha * ones, ones)  # (B, 1, Dv, Dk)
        return _read(state, keys)
    if method == "least_squares":
        # min ‖K X − V‖ (the smallest such X when several fit); pinv, unlike lstsq, solves
        # N < Dk on every device
        best = torch.linalg.pinv(keys) @ values  # (B, Dk, N) @ (B, N, Dv) -> (B, Dk, Dv)
        return keys @ best  # (B, N, Dv)
    raise ValueError(f"method must be 'softmax', 'linear', 'delta', 'least_squares', 'gated' "
                     f"or 'window', got {method!r}")


def retrieval_error(outputs: Tensor, values: Tensor) -> float:
    """The mean distance ‖o − v‖ between what was read and what was stored (values of unit
    length: 0 is perfect recall, 1 is as far as returning nothing).

    Args:
        outputs: what each query read, ``(B, N, D)``.
        values: the stored values ``(B, N, D)``, in the order of the queries.

    Returns:
        The mean distance over the batch and the queries.
    """
    return (outputs - values).norm(dim=-1).mean().item()


def recall_accuracy(outputs: Tensor, values: Tensor) -> float:
    """The fraction of queries whose output is closest (largest dot product) to the right one
    of the N stored values.

    Args:
        outputs: what each query read, ``(B, N, D)``.
        values: the stored values ``(B, N, D)``, in the order of the queries.

    Returns:
        The fraction in [0, 1].
    """
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


def recall_by_age(outputs: Tensor, values: Tensor, recent: int) -> dict:
    """Accuracy and error split by the pair's age: the last ``recent`` pairs written against
    the older ones.

    Args:
        outputs: ``(B, N, Dv)``, what a memory returned for each stored key, in writing order.
        values: ``(B, N, Dv)``, the stored values.
        recent: how many of the last pairs count as recent (1 <= recent < N).

    Returns:
        A dict of floats: ``"recent accuracy"``, ``"old accuracy"``, ``"recent error"``,
        ``"old error"`` (accuracy and error as in :func:`recall_accuracy` and
        :func:`retrieval_error`, each over its share of the pairs).
    """
    N = values.shape[1]
    if not 1 <= recent < N:
        raise ValueError(f"recent must be in [1, N) = [1, {N}), got {recent}")
    scores = outputs @ values.transpose(-2, -1)  # (B, N, N): each output against each value
    right = (scores.argmax(dim=-1) == torch.arange(N, device=values.device)).double()  # (B, N)
    distance = (outputs - values).norm(dim=-1)  # (B, N)
    return {"recent accuracy": right[:, -recent:].mean().item(),
            "old accuracy": right[:, :-recent].mean().item(),
            "recent error": distance[:, -recent:].mean().item(),
            "old error": distance[:, :-recent].mean().item()}


def recall_age_sweep(n_pairs: Sequence[int], d_key: int = 32, d_value: int = 32, *,
                     trials: int = 20, seed: int = 0, recent: int = 16, alpha: float = 0.95,
                     window: int = 16, scale: float = 30.0) -> dict:
    """Recall split by age for four memories: softmax attention over every pair, a sliding
    window of ``window`` pairs, the delta rule (β = 1) and Gated DeltaNet (β = 1, forget gate
    ``alpha``).

    Args:
        n_pairs: the numbers of pairs N to try, each larger than ``recent``.
        d_key, d_value: Dk and Dv.
        trials: independent sets of pairs per N.
        seed: seeds the pairs; each N draws new pairs from one stream.
        recent: the last pairs counted as recent.
        alpha: Gated DeltaNet's forget gate.
        window: the sliding window's W.
        scale: the softmax's inverse temperature (full and windowed).

    Returns:
        A dict: ``"n_pairs"``, and for each of ``"recent accuracy"``, ``"old accuracy"``,
        ``"recent error"`` and ``"old error"`` a dict memory -> array (one value per N);
        memories ``"softmax attention"``, ``"sliding window"``, ``"delta rule"``,
        ``"gated delta rule"``.
    """
    generator = torch.Generator().manual_seed(seed)
    runs = {"softmax attention": dict(method="softmax", scale=scale),
            "sliding window": dict(method="window", window=window, scale=scale),
            "delta rule": dict(method="delta"),
            "gated delta rule": dict(method="gated", alpha=alpha)}
    fields = ("recent accuracy", "old accuracy", "recent error", "old error")
    found = {field: {name: [] for name in runs} for field in fields}
    for n in n_pairs:
        keys, values = recall_pairs(trials, n, d_key, d_value, generator=generator)
        for name, kwargs in runs.items():
            split = recall_by_age(recall(keys, values, **kwargs), values, recent)
            for field in fields:
                found[field][name].append(split[field])
    return {"n_pairs": list(n_pairs),
            **{field: {name: np.array(x) for name, x in by_name.items()}
               for field, by_name in found.items()}}


# ---- sharing key/value heads: what grouped-query attention can no longer carry ------------

KV_HEADS_RECALL_FILE = "kv_heads_recall.json"  #: bench/kv_heads_recall.py


def attribute_recall_data(batch: int, n_items: int, d_key: int, n_attributes: int,
                          d_attribute: int, *, generator: torch.Generator | None = None
                          ) -> tuple[Tensor, Tensor, Tensor]:
    """Multi-attribute recall: N items, each a unit key and ``n_attributes`` random vectors,
    then N queries, each a stored key (in a random order) asking for all of its attributes.

    Args:
        batch: B, independent sequences.
        n_items: N, items (and queries) per sequence.
        d_key: Dk, the length of the keys.
        n_attributes, d_attribute: A attributes of Da numbers per item (standard normal,
            scaled to a mean squared length of 1 each).
        generator: the random stream.

    Returns:
        ``(items, queries, targets)``: items ``(B, N, Dk + A·Da)`` (the key, then the
        attributes), queries ``(B, N, Dk + A·Da)`` (a key, then zeros), targets
        ``(B, N, A·Da)`` (the attributes of the item each query names).
    """
    check_positive(batch=batch, n_items=n_items, d_key=d_key, n_attributes=n_attributes,
                   d_attribute=d_attribute)
    B, N, width = batch, n_items, n_attributes * d_attribute
    keys = F.normalize(torch.randn(B, N, d_key, generator=generator), dim=-1)  # (B, N, Dk)
    attributes = torch.randn(B, N, width, generator=generator) / d_attribute ** 0.5
    order = torch.argsort(torch.rand(B, N, generator=generator), dim=-1)  # (B, N)
    asked = keys.gather(1, order[..., None].expand(B, N, d_key))  # (B, N, Dk)
    targets = attributes.gather(1, order[..., None].expand(B, N, width))  # (B, N, A·Da)
    items = torch.cat([keys, attributes], dim=-1)  # (B, N, Dk + A·Da)
    queries = torch.cat([asked, torch.zeros(B, N, width)], dim=-1)  # (B, N, Dk + A·Da)
    return items, queries, targets


def shared_kv_recall(n_kv_heads: int, *, n_heads: int = 4, head_dim: int = 16,
                     d_attribute: int = 12, n_items: int = 16, steps: int = 200,
                     batch: int = 64, lr: float = 1e-2, seed: int = 0) -> dict:
    """Train one attention layer whose ``n_heads`` query heads share ``n_kv_heads`` key/value
    heads, plus a linear readout, to return every attribute of the item a query names.

    There is one attribute per query head (``A = n_heads``); the keys fill the rest of
    ``d_model = n_heads · head_dim``. Per item, the layer caches ``n_kv_heads · head_dim``
    value numbers, and the attributes are ``A · Da``: when those do not fit, no readout of
    the (one-hot) attended values can recover more than ``n_kv_heads · head_dim`` of the
    ``A · Da`` independent directions, so the error cannot fall below ``floor``.

    Args:
        n_kv_heads: H_kv, the key/value heads (``n_heads``: MHA, 1: MQA).
        n_heads, head_dim: H and D of the layer.
        d_attribute: Da, numbers per attribute (at most ``head_dim``, and ``n_heads · Da <
            n_heads · head_dim`` so that room is left for a key).
        n_items: N, items per sequence.
        steps, batch, lr: Adam's training run, on fresh data at every step.
        seed: seeds the layer's weights and the data.

    Returns:
        A dict: ``"error"``, the fraction of the targets' squared norm not recovered on 512
        fresh sequences (0 is perfect, 1 is returning nothing); ``"floor"``,
        ``max(0, 1 - H_kv·D / (A·Da))``; ``"cache_numbers"``, ``2·H_kv·D`` per item.
    """
    check_positive(n_kv_heads=n_kv_heads, steps=steps, batch=batch)
    d_model, width = n_heads * head_dim, n_heads * d_attribute
    if not 0 < d_attribute <= head_dim or width >= d_model:
        raise ValueError(f"d_attribute ({d_attribute}) must be in [1, head_dim ({head_dim})] "
                         f"and leave room for a key: n_heads * d_attribute ({width}) < "
                         f"d_model ({d_model})")
    shape = dict(n_items=n_items, d_key=d_model - width, n_attributes=n_heads,
                 d_attribute=d_attribute)
    with torch.random.fork_rng(devices=[]), torch.enable_grad():
        torch.manual_seed(seed)
        layer = MultiHeadAttention(d_model, n_heads, n_kv_heads, bias=False)
        readout = torch.nn.Linear(d_model, width, bias=False)
        params = [*layer.parameters(), *readout.parameters()]
        optimiser = torch.optim.Adam(params, lr=lr)
        data = torch.Generator().manual_seed(seed)
        for _ in range(steps):
            items, queries, targets = attribute_recall_data(batch, generator=data, **shape)
            out = readout(layer(queries, items))  # (B, N, A·Da): queries read the items
            loss = (out - targets).pow(2).sum() / targets.pow(2).sum()
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
    with torch.no_grad():
        test = torch.Generator().manual_seed(10_000 + seed)
        items, queries, targets = attribute_recall_data(512, generator=test, **shape)
        out = readout(layer(queries, items))  # (512, N, A·Da)
        error = ((out - targets).pow(2).sum() / targets.pow(2).sum()).item()
    return {"error": error, "floor": max(0.0, 1 - n_kv_heads * head_dim / width),
            "cache_numbers": 2 * n_kv_heads * head_dim}


def load_kv_heads_recall() -> dict:
    """The saved sweep of ``bench/kv_heads_recall.py``: its settings, and for each attribute
    size and number of key/value heads the error of every seed and the floor."""
    return load_json(KV_HEADS_RECALL_FILE)
