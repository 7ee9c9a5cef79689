"""The sequence-reversal task: a toy problem the 2017 encoder–decoder learns in seconds.

Vocabulary: token 0 is BOS (begin-of-sequence, the decoder's first input); tokens
1 … V-1 are symbols. The source is a random symbol sequence, the target the same
sequence reversed. The model "knows" its vocabulary through ``model.tgt_vocab_size``.
"""
from __future__ import annotations

import torch
from torch import Tensor

from transformer_lib.encoder_decoder import EncoderDecoder, LabelSmoothingLoss, noam_lambda

BOS = 0


def reversal_batch(batch_size: int, seq_len: int, vocab_size: int,
                   generator: torch.Generator | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """A batch of the reversal task.

    Returns:
        ``(src, tgt_in, tgt_out)``, each ``(B, seq_len)``: the source symbols, the decoder
        input (BOS followed by the reversed source without its last token: teacher forcing),
        and the decoder target (the reversed source).
    """
    if batch_size < 1 or seq_len < 1:
        raise ValueError(f"batch_size ({batch_size}) and seq_len ({seq_len}) must be positive")
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be >= 2 (BOS plus at least one symbol), got {vocab_size}")
    src = torch.randint(1, vocab_size, (batch_size, seq_len), generator=generator)  # (B, T)
    tgt_out = src.flip(1)  # (B, T)
    bos = torch.full((batch_size, 1), BOS, dtype=torch.long)  # (B, 1)
    tgt_in = torch.cat([bos, tgt_out[:, :-1]], dim=1)  # (B, T)
    return src, tgt_in, tgt_out


def train_reversal(*, seq_len: int = 8, n_symbols: int = 10, n_layers: int = 2, n_heads: int = 2,
                   d_model: int = 32, d_ff: int = 64, dropout: float = 0.0, steps: int = 200,
                   batch_size: int = 256, warmup: int = 60, lr_scale: float = 0.4,
                   smoothing: float = 0.1, seed: int = 0) -> tuple[EncoderDecoder, dict]:
    """Train a post-norm encoder–decoder to reverse random sequences of length ``seq_len``.

    Adam (β = 0.9, 0.98, ε = 1e-9) with the Noam schedule times ``lr_scale``, label smoothing,
    fresh random batches every step, all seeded by ``seed``.

    Returns:
        ``(model, history)``: the model in eval mode, and ``{"step", "loss", "lr"}`` lists
        (one entry per update; the learning rate of update ``step`` is the Noam value at
        ``step``, so it peaks at ``step == warmup``).
    """
    if steps < 1:
        raise ValueError(f"steps must be positive, got {steps}")
    if n_symbols < 1:
        raise ValueError(f"n_symbols must be positive, got {n_symbols}")
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    vocab_size = n_symbols + 1  # BOS + symbols
    model = EncoderDecoder(vocab_size, vocab_size, d_model=d_model, n_heads=n_heads,
                           n_layers=n_layers, d_ff=d_ff, dropout=dropout, max_len=64)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr_scale, betas=(0.9, 0.98), eps=1e-9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, noam_lambda(d_model, warmup))
    loss_fn = LabelSmoothingLoss(smoothing)
    history = {"step": [], "loss": [], "lr": []}
    model.train()
    for step in range(steps):  # LambdaLR's step count: update `step` uses noam(step)
        src, tgt_in, tgt_out = reversal_batch(batch_size, seq_len, vocab_size, gen)
        logits = model(src, tgt_in)  # (B, T, V)
        loss = loss_fn(logits, tgt_out)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        history["step"].append(step)
        history["loss"].append(loss.item())
        history["lr"].append(optimizer.param_groups[0]["lr"])
        scheduler.step()
    model.eval()
    return model, history


def _greedy_reverse(model: EncoderDecoder, n: int, seq_len: int, seed: int) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    src, _, tgt_out = reversal_batch(n, seq_len, model.tgt_vocab_size, gen)
    was_training = model.training
    model.eval()
    pred = model.greedy_decode(src, seq_len, BOS)[:, 1:]  # (n, seq_len), BOS dropped
    model.train(was_training)
    return src, pred, tgt_out


def evaluate_reversal(model: EncoderDecoder, n: int = 1000, seq_len: int = 8,
                      seed: int = 12345) -> dict[str, float]:
    """Greedy-decode ``n`` fresh random sequences and compare with their reversal.

    Returns:
        ``{"exact_match": fraction of sequences entirely right,
        "token_accuracy": fraction of tokens right}``.
    """
    if n < 1 or seq_len < 1:
        raise ValueError(f"n ({n}) and seq_len ({seq_len}) must be positive")
    if seq_len + 1 > model.max_len:
        raise ValueError(f"seq_len ({seq_len}) must be < the model's max_len ({model.max_len})")
    _, pred, target = _greedy_reverse(model, n, seq_len, seed)
    correct = pred == target  # (n, seq_len)
    return {
        "exact_match": correct.all(dim=1).float().mean().item(),
        "token_accuracy": correct.float().mean().item(),
    }


@torch.no_grad()
def cross_attention_alignment(model: EncoderDecoder, n: int = 200, seq_len: int = 8,
                              seed: int = 12345) -> Tensor:
    """How often each cross-attention head looks at the mirrored source position.

    During greedy decoding, output step t should copy source position ``seq_len - 1 - t``.
    For every decoder layer and head, this is the fraction of (sequence, step) pairs whose
    cross-attention argmax over source keys is that mirrored position.

    Returns:
        ``(n_layers, n_heads)`` tensor of fractions in [0, 1].
    """
    if n < 1 or seq_len < 1:
        raise ValueError(f"n ({n}) and seq_len ({seq_len}) must be positive")
    src, pred, _ = _greedy_reverse(model, n, seq_len, seed)
    # Re-running the decoder on BOS + its own outputs gives, row by row, exactly the
    # attention of each greedy step (the causal mask hides later tokens).
    bos = torch.full((n, 1), BOS, dtype=torch.long)
    was_training = model.training
    model.eval()
    model(src, torch.cat([bos, pred[:, :-1]], dim=1))
    model.train(was_training)
    mirrored = torch.arange(seq_len - 1, -1, -1)  # (T,) step t reads source T-1-t
    rows = []
    for layer in model.decoder.layers:
        weights = layer.cross_attn.last_weights  # (n, H, T, S)
        hits = weights.argmax(dim=-1) == mirrored  # (n, H, T)
        rows.append(hits.float().mean(dim=(0, 2)))  # (H,)
    return torch.stack(rows)  # (n_layers, H)
