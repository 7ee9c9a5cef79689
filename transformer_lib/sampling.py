"""Choosing the next token from logits: greedy decoding, temperature, top-k and top-p.

Pure functions of the last position's logits ``(B, V)``; no model. The rule, in the order of
Hugging Face's logits warpers:

1. **temperature** τ: ``softmax(logits / τ)`` in fp32 (fp64 stays fp64). τ < 1 sharpens the
   distribution, τ > 1 flattens it; τ = 0 is greedy decoding (the argmax).
2. **top-k**: keep the ``top_k`` most likely tokens. Exactly ``top_k`` tokens survive: where
   several tokens tie at the k-th largest value, those with the smallest ids are kept
   (a stable sort, the order ``argmax`` also prefers).
3. **top-p** (nucleus): of what is left, keep the smallest set of most likely tokens whose
   probability reaches ``top_p``. Sorted from most to least likely, a token is kept while the
   probability of the tokens *before* it is below ``top_p``, so the most likely token always
   survives and the token that reaches ``top_p`` is the last one kept. ``top_p = 1`` keeps
   every token.
4. The survivors' probabilities are renormalised to sum to 1, and ``torch.multinomial`` draws
   one token per row.

:func:`next_token_probs` returns the distribution of step 4, so that tests and chapters can
show what :func:`sample_next_token` draws from.
"""
from __future__ import annotations

import torch
from torch import Tensor

from transformer_lib.validation import check_float, check_int, compute_dtype

__all__ = ["check_sampling", "next_token_probs", "sample_next_token"]


def check_sampling(temperature: float, top_k: int | None, top_p: float | None,
                   vocab_size: int) -> None:
    """Raise a ValueError naming the argument and its value unless the sampling rule is valid.

    Args:
        temperature: a finite number >= 0 (0 means greedy).
        top_k: None or an int in ``[1, vocab_size]``.
        top_p: None or a number in ``(0, 1]``.
        vocab_size: V, the number of tokens to choose from.
    """
    check_float("temperature", temperature, low=0.0)
    if top_k is not None:
        check_int("top_k", top_k, low=1, high=vocab_size)
    if top_p is not None:
        check_float("top_p", top_p, low=0.0, high=1.0, low_open=True)


def _check_logits(logits: Tensor) -> None:
    if not isinstance(logits, Tensor) or logits.dim() != 2 or not logits.is_floating_point():
        got = (f"shape {tuple(logits.shape)}, {logits.dtype}" if isinstance(logits, Tensor)
               else type(logits).__name__)
        raise ValueError(f"logits must be a floating-point tensor of shape (B, V), got {got}")


def next_token_probs(logits: Tensor, *, temperature: float = 1.0, top_k: int | None = None,
                     top_p: float | None = None) -> Tensor:
    """The distribution :func:`sample_next_token` draws the next token from.

    Args:
        logits: ``(B, V)``, the last position's logits.
        temperature: τ >= 0; 0 gives all the mass to the argmax (greedy decoding).
        top_k: keep only the ``top_k`` most likely tokens (ties: the smallest ids), or None.
        top_p: keep only the smallest set of most likely tokens whose probability reaches
            ``top_p`` (after top-k), or None.

    Returns:
        ``(B, V)`` probabilities in fp32 (fp64 for fp64 logits): zero outside the kept
        tokens, each row summing to 1.
    """
    _check_logits(logits)
    check_sampling(temperature, top_k, top_p, logits.shape[-1])
    dtype = compute_dtype(logits.dtype)  # fp16/bf16 -> fp32; fp32, fp64 stay
    if temperature == 0:
        greedy = logits.argmax(dim=-1, keepdim=True)  # (B, 1)
        return torch.zeros_like(logits, dtype=dtype).scatter_(-1, greedy, 1.0)  # (B, V)
    scaled = logits.to(dtype) / temperature  # (B, V)
    if top_k is None and (top_p is None or top_p == 1.0):
        return torch.softmax(scaled, dim=-1)  # (B, V): nothing to cut, no sort needed
    # Most likely first; stable, so tied tokens keep their id order (smallest id first).
    ranked, order = torch.sort(scaled, dim=-1, descending=True, stable=True)  # (B, V) each
    if top_k is not None:
        ranked[:, top_k:] = float("-inf")
    if top_p is not None and top_p < 1.0:
        probs = torch.softmax(ranked, dim=-1)  # (B, V), sorted
        before = probs.cumsum(dim=-1) - probs  # (B, V): mass of the more likely tokens
        ranked = ranked.masked_fill(before >= top_p, float("-inf"))
    probs = torch.softmax(ranked, dim=-1)  # (B, V): renormalised over the survivors
    return torch.zeros_like(probs).scatter_(-1, order, probs)  # (B, V), back in id order


def _same_device(a: torch.device, b: torch.device) -> bool:
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


def sample_next_token(logits: Tensor, *, temperature: float = 1.0, top_k: int | None = None,
                      top_p: float | None = None,
                      generator: torch.Generator | None = None) -> Tensor:
    """Choose the next token of each row: greedy at ``temperature == 0``, else one draw
    from :func:`next_token_probs`.

    Args:
        logits: ``(B, V)``, the last position's logits.
        temperature, top_k, top_p: as in :func:`next_token_probs`.
        generator: the random stream of the draws (None: torch's global one); it must be on
            the logits' device, e.g. ``torch.Generator(device=logits.device)``.

    Returns:
        ``(B, 1)`` LongTensor of token ids.
    """
    _check_logits(logits)
    check_sampling(temperature, top_k, top_p, logits.shape[-1])
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)  # (B, 1)
    if generator is not None and not _same_device(generator.device, logits.device):
        raise ValueError(f"the generator is on {generator.device} but the logits are on "
                         f"{logits.device}: make it with torch.Generator(device=...) on the "
                         "logits' device")
    probs = next_token_probs(logits, temperature=temperature, top_k=top_k, top_p=top_p)
    return torch.multinomial(probs, 1, generator=generator)  # (B, 1)
