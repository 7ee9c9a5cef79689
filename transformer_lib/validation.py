"""Input checks that both models share, so that bad input gets the same clear ValueError."""
from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any, Mapping, Sequence

import torch
from torch import Tensor


def check_token_ids(tokens: Tensor, vocab_size: int, *, name: str = "tokens") -> None:
    """Raise a ValueError unless ``tokens`` is a ``(B, T)`` integer tensor of ids in
    ``[0, vocab_size - 1]`` with ``T >= 1``; the message names ``name`` and the values."""
    if not isinstance(tokens, Tensor) or tokens.dtype not in (torch.int64, torch.int32):
        dtype = tokens.dtype if isinstance(tokens, Tensor) else type(tokens).__name__
        raise ValueError(f"{name} must be an integer (Long) tensor of token ids, got {dtype}")
    if tokens.dim() != 2 or tokens.shape[1] < 1:
        raise ValueError(f"{name} must have shape (B, T) with T >= 1, got {tuple(tokens.shape)}")
    lo, hi = int(tokens.min()), int(tokens.max())
    if lo < 0 or hi >= vocab_size:
        raise ValueError(f"ids in {name} must be in [0, {vocab_size - 1}] "
                         f"(vocab_size={vocab_size}), got min {lo}, max {hi}")


def check_positive(**sizes: int) -> None:
    """Raise a ValueError naming every size that is not a positive integer (:func:`check_int`),
    e.g. ``check_positive(d_model=0, n_heads=4)``: "d_model must be positive, got 0";
    ``check_positive(n_heads="4")``: "n_heads must be a positive integer, got '4' (str)"."""
    bad = []
    for name, value in sizes.items():
        try:
            check_int(name, value)
        except ValueError as exc:
            bad.append(str(exc))
    if bad:
        raise ValueError("; ".join(bad))


# Attention inputs and numerics: one rule each, shared by every attention implementation.


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a softmax, a norm or a running sum is computed in: fp16 and bf16 go up to
    fp32 (their few bits of mantissa and, for fp16, small range would lose the result);
    fp32 and fp64 stay as they are. The result is cast back to the input dtype afterwards."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def zero_rows_without_keys(x: Tensor, mask: Tensor | None, S: int, *,
                           causal: bool = False) -> Tensor:
    """The rule every attention path follows: a query that sees no key gets 0 (zero weights, a
    zero output), not the NaN of a softmax over -inf alone. "Sees no key" is read from the
    mask the query actually gets: ``mask`` AND, with ``causal``, the bottom-right causal mask
    (query i sees keys 0 … S - T + i), without forming that ``(T, S)`` mask.

    Args:
        x: the weights ``(..., T, S)`` or the output ``(..., T, Dv)`` of attention.
        mask: boolean, broadcastable to ``(..., T, S)``, True = may attend; None blocks
            nothing (causal alone always leaves a query key 0).
        S: the number of keys.
        causal: the T queries are the last T of the S positions.

    Returns:
        ``x``, with the rows of queries that see no key set to 0 (``x`` itself when there are
        none).
    """
    if mask is None:
        return x
    T = x.shape[-2]
    mask = mask.reshape((1,) * max(0, 2 - mask.dim()) + tuple(mask.shape))  # (..., T or 1, ·)
    has_key = mask.any(dim=-1)  # (..., T or 1)
    if causal:  # the first key the mask lets through must come before the query's last one
        first = mask.to(torch.uint8).argmax(dim=-1)  # (..., T or 1); argmax: the first 1
        last = torch.arange(S - T, S, device=mask.device)  # (T,): query i sees keys ≤ S - T + i
        has_key = has_key & (first <= last)  # (..., T)
    has_key = has_key[..., None]  # (..., T or 1, 1)
    if bool(has_key.all()):
        return x
    return x.masked_fill(~has_key, 0.0)


def check_qkv(q: Tensor, k: Tensor, v: Tensor) -> None:
    """Raise a ValueError naming the values unless queries ``(..., T, D)``, keys
    ``(..., S, D)`` and values ``(..., S, Dv)`` fit together: floating point, one dtype, at
    least two dimensions, the same positive head dim D for q and k, the same S for k and v,
    and T, S >= 1. Leading dimensions are left to the caller (they may broadcast)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not x.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
        if x.dim() < 2:
            raise ValueError(f"{name} must have shape (..., positions, dim), got {tuple(x.shape)}")
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"q, k and v must have one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.shape[-1] != k.shape[-1] or q.shape[-1] < 1:
        raise ValueError(
            f"q and k must have the same positive head dim, got {q.shape[-1]} and {k.shape[-1]}"
        )
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"k and v must have the same number of positions, got {k.shape[-2]} and {v.shape[-2]}"
        )
    if q.shape[-2] < 1 or k.shape[-2] < 1:
        raise ValueError(f"attention needs T >= 1 queries and S >= 1 keys, "
                         f"got T={q.shape[-2]}, S={k.shape[-2]}")


def check_mask(mask: Tensor, T: int, S: int, batch_shape: Sequence[int]) -> None:
    """Raise a ValueError unless ``mask`` is boolean (True = may attend) and broadcasts to
    scores of shape ``(*batch_shape, T, S)``."""
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        kind = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
        raise ValueError(f"mask must be a boolean tensor (True = may attend), got dtype {kind}")
    target = (*batch_shape, T, S)
    try:
        broadcast = torch.broadcast_shapes(tuple(mask.shape), target)
    except RuntimeError:
        broadcast = None
    if broadcast != target:
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to scores of shape {target}"
        )


# Config fields: one type-and-range check per kind of field, one wording for every config.


def _int_range(low: int, high: int | None) -> str:
    if high is not None:
        return f"in [{low}, {high}]"
    return "positive" if low == 1 else f">= {low}"


def check_int(name: str, value: Any, *, low: int = 1, high: int | None = None) -> None:
    """Raise a ValueError unless ``value`` is an integer (a ``bool`` is not) in
    ``[low, high]`` (``high=None``: no upper bound); the message names ``name`` and the value.

    ``check_int("n_heads", 2.5)``: "n_heads must be a positive integer, got 2.5 (float)";
    ``check_int("n_heads", 0)``: "n_heads must be positive, got 0".
    """
    where = _int_range(low, high)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        kind = "a positive integer" if where == "positive" else f"an integer {where}"
        raise ValueError(f"{name} must be {kind}, got {value!r} ({type(value).__name__})")
    if value < low or (high is not None and value > high):
        raise ValueError(f"{name} must be {where}, got {value}")


def _float_range(low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    if low == 0 and low_open and high is None:
        return "positive"
    if high is None:
        return f"{'>' if low_open else '>='} {low:g}" if low is not None else "finite"
    if low is None:
        return f"{'<' if high_open else '<='} {high:g}"
    return f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"


def check_float(name: str, value: Any, *, low: float | None = None, high: float | None = None,
                low_open: bool = False, high_open: bool = False) -> None:
    """Raise a ValueError unless ``value`` is a finite real number (an ``int`` is one, a
    ``bool`` is not) between ``low`` and ``high`` (``None``: unbounded; ``*_open``: the bound
    itself is excluded); the message names ``name`` and the value.

    ``check_float("rope_theta", "none", low=0, low_open=True)``: "rope_theta must be a
    positive number, got 'none' (str)"; ``check_float("dropout", 1.0, low=0, high=1,
    high_open=True)``: "dropout must be in [0, 1), got 1.0". NaN and ±inf are rejected.
    """
    where = _float_range(low, high, low_open, high_open)
    kind = "a positive number" if where == "positive" else f"a number {where}"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be {kind}, got {value!r} ({type(value).__name__})")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be {kind.replace('a ', 'a finite ', 1)}, got {value}")
    too_low = low is not None and (value <= low if low_open else value < low)
    too_high = high is not None and (value >= high if high_open else value > high)
    if too_low or too_high:
        raise ValueError(f"{name} must be {where}, got {value}")


def check_bool(name: str, value: Any) -> None:
    """Raise a ValueError unless ``value`` is ``True`` or ``False`` (not 0, 1 or "yes")."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")


def check_choice(name: str, value: Any, choices: Sequence[str]) -> None:
    """Raise a ValueError unless ``value`` is one of ``choices``:
    "rope_pairing must be one of ('half', 'interleaved'), got 'adjacent'"."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")


def check_overrides(config_cls: type, overrides: Mapping[str, Any]) -> None:
    """Raise a ValueError naming every key of ``overrides`` that is not a field of the config
    dataclass ``config_cls``, e.g. "unknown EncoderDecoderConfig fields: ['heads']".

    For functions like :func:`transformer_lib.tasks.reversal_config` that build a config from
    defaults and let the caller replace any field.

    Args:
        config_cls: a config dataclass, e.g. ``EncoderDecoderConfig`` or ``DecoderConfig``.
        overrides: field name -> value, as passed by the caller.
    """
    fields = {f.name for f in dataclasses.fields(config_cls) if f.init}
    unknown = set(overrides) - fields
    if unknown:
        raise ValueError(f"unknown {config_cls.__name__} fields: {sorted(unknown)}")
