"""The sequence-reversal task: a toy problem the 2017 encoder–decoder learns in seconds, and
the analysis of what its cross-attention learnt. Chapter 4's training-stability ablation on it
is in :mod:`transformer_lib.stability`.

Vocabulary: token 0 is BOS (begin-of-sequence, the decoder's first input); tokens
1 … V-1 are symbols. The source is a random symbol sequence, the target the same
sequence reversed. The model "knows" its vocabulary through ``model.tgt_vocab_size``.

Nothing here touches the global random state: data come from local generators, and model
initialisation and dropout run inside ``torch.random.fork_rng``. A notebook that draws
random numbers afterwards seeds them itself.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from transformer_lib.encoder_decoder import (
    EncoderDecoder,
    EncoderDecoderConfig,
    LabelSmoothingLoss,
    noam_lambda,
)
from transformer_lib.recording import eval_mode, record_weights
from transformer_lib.validation import check_overrides

BOS = 0  #: the begin-of-sequence token that starts every decoder input


def reversal_batch(batch_size: int, seq_len: int, vocab_size: int,
                   generator: torch.Generator | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """A batch of the reversal task.

    Args:
        batch_size: B.
        seq_len: the length of every sequence.
        vocab_size: BOS (id 0) plus the symbols ``1 … vocab_size - 1``.
        generator: the random source (None: PyTorch's global one).

    Returns:
        ``(src, tgt_in, tgt_out)``, each ``(B, seq_len)``: the source symbols, the decoder
        input (BOS followed by the reversed source without its last token: teacher forcing),
        and the decoder target (the reversed source).
    """
    if batch_size < 1 or seq_len < 1:
        raise ValueError(f"batch_size ({batch_size}) and seq_len ({seq_len}) must be positive")
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be >= 2 (BOS plus at least one symbol), "
                         f"got {vocab_size}")
    src = torch.randint(1, vocab_size, (batch_size, seq_len), generator=generator)  # (B, T)
    tgt_out = src.flip(1)  # (B, T)
    bos = torch.full((batch_size, 1), BOS, dtype=torch.long)  # (B, 1)
    tgt_in = torch.cat([bos, tgt_out[:, :-1]], dim=1)  # (B, T)
    return src, tgt_in, tgt_out


def reversal_config(n_symbols: int = 10, **overrides) -> EncoderDecoderConfig:
    """The model :func:`train_reversal` trains by default: 2 layers, 2 heads, ``d_model`` 32,
    ``d_ff`` 64, no dropout, over a vocabulary of BOS + ``n_symbols``. ``overrides`` replace
    any field, e.g. ``reversal_config(n_layers=1, n_heads=1)``.

    ``max_seq_len`` is 64: room for sequences much longer than the 8 tokens of training, so that
    evaluating on other lengths is possible (and fails, as chapter 2 shows).

    Args:
        n_symbols: the symbols besides BOS.
        **overrides: fields of :class:`~transformer_lib.encoder_decoder.EncoderDecoderConfig`
            to set instead of the defaults.

    Returns:
        The config.
    """
    if n_symbols < 1:
        raise ValueError(f"n_symbols must be positive, got {n_symbols}")
    fields = dict(src_vocab_size=n_symbols + 1, tgt_vocab_size=n_symbols + 1, d_model=32,
                  n_heads=2, n_layers=2, d_ff=64, dropout=0.0, max_seq_len=64)
    check_overrides(EncoderDecoderConfig, overrides)
    fields.update(overrides)
    return EncoderDecoderConfig(**fields)


SCHEDULES = ("noam", "no-warmup")  #: the learning-rate schedules train_reversal knows


def no_warmup_lambda(d_model: int, warmup: int) -> Callable[[int], float]:
    """The Noam schedule without its warm-up, as a multiplier for ``LambdaLR``: the peak rate
    d_model^-0.5 · warmup^-0.5 from the first step, then the same 1/√t decay after ``warmup``.

    lr(t) = d_model^-0.5 · max(t, warmup)^-0.5: equal to
    :func:`~transformer_lib.encoder_decoder.noam_lambda` for t ≥ warmup, and flat at its peak
    before, so a run with it differs from a Noam run only by the rise.

    Args:
        d_model: C, the model width.
        warmup: the step where the decay starts.

    Returns:
        ``lr_lambda(step) -> float``, the multiplier at each step.
    """
    if d_model < 1 or warmup < 1:
        raise ValueError(f"d_model ({d_model}) and warmup ({warmup}) must be positive")

    def lr_lambda(step: int) -> float:
        return d_model ** -0.5 * max(step, warmup) ** -0.5

    return lr_lambda


def train_reversal(config: EncoderDecoderConfig | None = None, *, seq_len: int = 8,
                   steps: int = 200, batch_size: int = 256, warmup: int = 60,
                   lr_scale: float = 0.4, smoothing: float = 0.1, seed: int = 0,
                   schedule: str = "noam") -> tuple[EncoderDecoder, dict[str, list]]:
    """Train an encoder–decoder (post-norm unless ``config.norm_first``) to reverse random
    sequences of length ``seq_len``.

    Adam (β = 0.9, 0.98, ε = 1e-9) with a learning-rate schedule times ``lr_scale``, label
    smoothing, fresh random batches every step, all seeded by ``seed``; the global random
    state is left as it was.

    Args:
        config: the model; None means :func:`reversal_config` ``()``. Source and target share
            one vocabulary: BOS + symbols.
        seq_len: the length of the training sequences.
        steps: optimizer updates.
        batch_size: sequences per update, fresh every step.
        warmup: the schedule's ``warmup`` step.
        lr_scale: the optimizer's base learning rate, which the schedule multiplies.
        smoothing: label smoothing ε of the loss.
        seed: seeds the model's initialisation and the batches.
        schedule: ``"noam"``, :func:`~transformer_lib.encoder_decoder.noam_lambda` (linear
            rise to the peak at step ``warmup``, then 1/√t); or ``"no-warmup"``,
            :func:`no_warmup_lambda` (that peak rate from the first step, the same decay
            after ``warmup``).

    Returns:
        ``(model, history)``: the model in eval mode, and ``{"step", "loss", "lr",
        "grad_norm"}`` lists, one entry per update: its loss, its learning rate (the
        schedule's value at ``step``; Noam peaks at ``step == warmup``) and the norm of the
        whole gradient it applied (before the optimizer step; the loss and the norm are NaN
        or inf if training blew up).
    """
    config = reversal_config() if config is None else config
    if not isinstance(config, EncoderDecoderConfig):
        raise ValueError(f"config must be an EncoderDecoderConfig, got {type(config).__name__}")
    if config.src_vocab_size != config.tgt_vocab_size or config.tgt_vocab_size < 2:
        raise ValueError("reversal needs one vocabulary of BOS + symbols for source and target, "
                         f"got src_vocab_size={config.src_vocab_size}, "
                         f"tgt_vocab_size={config.tgt_vocab_size}")
    if steps < 1:
        raise ValueError(f"steps must be positive, got {steps}")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    if not 1 <= seq_len < config.max_seq_len:
        raise ValueError(f"seq_len ({seq_len}) must be in "
                         f"[1, max_seq_len - 1 = {config.max_seq_len - 1}]")
    gen = torch.Generator().manual_seed(seed)  # the training batches
    history: dict[str, list] = {"step": [], "loss": [], "lr": [], "grad_norm": []}
    rate = noam_lambda if schedule == "noam" else no_warmup_lambda
    with torch.random.fork_rng(devices=[]):  # initialisation and dropout leave no trace
        torch.manual_seed(seed)
        model = EncoderDecoder(config)
        optimizer = torch.optim.Adam(model.parameters(), lr=lr_scale, betas=(0.9, 0.98), eps=1e-9)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, rate(config.d_model, warmup))
        loss_fn = LabelSmoothingLoss(smoothing)
        model.train()
        for step in range(steps):  # LambdaLR's step count: update `step` uses noam(step)
            src, tgt_in, tgt_out = reversal_batch(batch_size, seq_len, config.tgt_vocab_size, gen)
            logits = model(src, tgt_in)  # (B, T, V)
            loss = loss_fn(logits, tgt_out)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grads = [p.grad.norm() for p in model.parameters() if p.grad is not None]
            history["grad_norm"].append(torch.stack(grads).norm().item())  # ‖whole gradient‖
            optimizer.step()
            history["step"].append(step)
            history["loss"].append(loss.item())
            history["lr"].append(optimizer.param_groups[0]["lr"])
            scheduler.step()
    model.eval()
    return model, history


def _check_lengths(model: EncoderDecoder, n: int, seq_len: int) -> None:
    if n < 1 or seq_len < 1:
        raise ValueError(f"n ({n}) and seq_len ({seq_len}) must be positive")
    if seq_len + 1 > model.max_seq_len:
        raise ValueError(f"seq_len ({seq_len}) must be < the model's max_seq_len "
                         f"({model.max_seq_len})")


def _fresh_sources(model: EncoderDecoder, n: int, seq_len: int, seed: int) -> tuple[Tensor, Tensor]:
    """``n`` seeded random sources ``(n, seq_len)`` and their reversals."""
    src, _, tgt_out = reversal_batch(n, seq_len, model.tgt_vocab_size,
                                     torch.Generator().manual_seed(seed))
    return src, tgt_out


@torch.no_grad()
def decode_with_cross_attention(model: EncoderDecoder, src: Tensor) -> tuple[Tensor, Tensor]:
    """Greedy-decode ``src`` into ``S`` tokens, in eval mode, and return the
    cross-attention of every decoding step.

    Args:
        model: a reversal model.
        src: source token ids ``(B, S)``.

    Returns:
        ``(out, weights)``: ``out`` ``(B, 1 + S)``, BOS then the decoded tokens; ``weights``
        ``(L, B, H, S, S)``, the cross-attention of each decoder layer, row t being the
        step that emitted ``out[:, t + 1]``.
    """
    if src.dim() != 2:
        raise ValueError(f"src must have shape (B, S), got {tuple(src.shape)}")
    S = src.shape[1]
    with eval_mode(model):
        out = model.greedy_decode(src, S, BOS)  # (B, 1 + S)
        # Re-running the decoder on BOS + its own outputs gives, row by row, exactly the
        # attention of each greedy step (the causal mask hides later tokens).
        with record_weights(model):
            model(src, out[:, :S])
    weights = torch.stack([layer.cross_attn.last_weights for layer in model.decoder.layers])
    return out, weights  # (B, 1 + S), (L, B, H, S, S)


def mirror_alignment(weights: Tensor) -> Tensor:
    """How often each head looks at the mirrored source position.

    Args:
        weights: cross-attention ``(..., n, H, T, S)`` with ``S == T``: step t of the
            reversal should read source position ``T - 1 - t``.

    Returns:
        ``(..., H)``: for each head, the fraction of (sequence, step) pairs whose argmax over
        the keys is the mirrored position.
    """
    T, S = weights.shape[-2:]
    if weights.dim() < 4 or T != S:
        raise ValueError(f"weights must have shape (..., n, H, T, T), got {tuple(weights.shape)}")
    mirrored = torch.arange(T - 1, -1, -1, device=weights.device)  # (T,) step t reads T-1-t
    hits = weights.argmax(dim=-1) == mirrored  # (..., n, H, T)
    return hits.float().mean(dim=-1).mean(dim=-2)  # (..., H): over steps, then sequences


def evaluate_reversal(model: EncoderDecoder, n: int = 1000, seq_len: int = 8,
                      seed: int = 12345) -> dict[str, float]:
    """Greedy-decode ``n`` fresh random sequences and compare with their reversal.

    Args:
        model: a reversal model.
        n: sequences to decode.
        seq_len: their length.
        seed: seeds the sequences (the global random state is left alone).

    Returns:
        A dict: ``"exact_match"``, the fraction of sequences entirely right, and
        ``"token_accuracy"``, the fraction of tokens right.
    """
    _check_lengths(model, n, seq_len)
    src, target = _fresh_sources(model, n, seq_len, seed)
    with eval_mode(model):
        pred = model.greedy_decode(src, seq_len, BOS)[:, 1:]  # (n, seq_len), BOS dropped
    correct = pred == target  # (n, seq_len)
    return {
        "exact_match": correct.all(dim=1).float().mean().item(),
        "token_accuracy": correct.float().mean().item(),
    }


def cross_attention_alignment(model: EncoderDecoder, n: int = 200, seq_len: int = 8,
                              seed: int = 12345) -> Tensor:
    """How often each cross-attention head looks at the mirrored source position while the
    model greedy-decodes ``n`` fresh random sequences (:func:`mirror_alignment` of the
    weights of :func:`decode_with_cross_attention`).

    Args:
        model: a reversal model.
        n: sequences to decode.
        seq_len: their length.
        seed: seeds the sequences.

    Returns:
        ``(n_layers, n_heads)`` tensor of fractions in [0, 1].
    """
    _check_lengths(model, n, seq_len)
    src, _ = _fresh_sources(model, n, seq_len, seed)
    _, weights = decode_with_cross_attention(model, src)  # (L, n, H, T, T)
    return mirror_alignment(weights)  # (L, H)
