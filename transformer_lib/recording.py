"""Switching a model's state for one ``with`` block: asking layers for what they computed
(attention weights, a router's choices), and eval mode.

Layers that can keep such tensors (:class:`transformer_lib.attention.MultiHeadAttention`,
:class:`transformer_lib.variants.moe.MoEFeedForward`) keep nothing by default, so a model
holds no ``(B, H, T, S)`` tensor between calls; they keep them when built with
``keep_weights=True`` or while :func:`record_weights` is on.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch.nn as nn

__all__ = ["record_weights", "eval_mode"]


@contextmanager
def record_weights(module: nn.Module) -> Iterator[nn.Module]:
    """Keep the weights of every layer of ``module`` that can keep them, inside the block.

    Sets ``keep_weights = True`` on every submodule with a ``keep_weights`` attribute
    (:class:`transformer_lib.attention.MultiHeadAttention`: ``last_weights``;
    :class:`transformer_lib.variants.moe.MoEFeedForward`: ``last_router_probs`` and
    ``last_expert_index``) and restores the old values on exit. What a forward pass inside
    the block recorded stays readable after it, until that layer's next forward::

        with record_weights(model):
            model(tokens)
        weights = model.layers[0].self_attn.last_weights  # (B, H, T, S)

    Args:
        module: a model or a layer.

    Yields:
        ``module`` itself.

    Raises:
        ValueError: ``module`` has no such layer.
    """
    layers = [m for m in module.modules() if hasattr(m, "keep_weights")]
    if not layers:
        raise ValueError(f"{type(module).__name__} has no layer that keeps weights "
                         "(no submodule with a keep_weights attribute)")
    before = [m.keep_weights for m in layers]
    for m in layers:
        m.keep_weights = True
    try:
        yield module
    finally:
        for m, kept in zip(layers, before):
            m.keep_weights = kept


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Put ``model`` in eval mode (dropout off) inside the ``with`` block, then restore the
    mode it had."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)
