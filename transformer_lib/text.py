"""Real text for the modern decoder: the bundled Shakespeare, a character tokenizer, batches
for next-token training, a small training loop (with SwiGLU or a ReLU FFN, RMSNorm or
LayerNorm, for chapter 6's comparison), and the checkpoint trained on it.

The text and the saved results ship inside the library (``transformer_lib/data/``, read with
``importlib.resources``), so a notebook finds them wherever the library is installed,
Colab included; ``transformer_lib/data/README.md`` gives their source and licence.

Like :mod:`transformer_lib.tasks`, nothing here touches the global random state: batches
come from local generators, and model initialisation runs inside
``torch.random.fork_rng``. A notebook that draws random numbers afterwards seeds them itself.
"""
from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from transformer_lib.decoder import Decoder, DecoderConfig, init_weights
from transformer_lib.ffn import FeedForward
from transformer_lib.norms import LayerNorm
from transformer_lib.resources import data_file, load_json
from transformer_lib.validation import check_overrides

TEXT_FILE = "shakespeare.txt"  # the bundled text: three plays, about 330 KB of ASCII
CHECKPOINT_FILE = "tiny_lm.pt"  # the model trained on it by bench/train_text_model.py
SWEEP_FILE = "kv_heads_sweep.json"  # MHA / GQA / MQA at one budget, several seeds
FFN_NORM_FILE = "ffn_norm_ablation.json"  #: SwiGLU/ReLU x RMSNorm/LayerNorm, several seeds
FFNS = ("swiglu", "relu")  #: the feed-forward network of every block
NORM_KINDS = ("rms", "layer")  #: the norms of every block and the final one
CHECKPOINT_FORMAT = 1  # bumped when the layout of a saved checkpoint changes

__all__ = [
    "CharTokenizer", "load_text", "split_ids", "next_token_batch",
    "text_config", "train_text_model", "evaluate_loss", "generate_text",
    "save_text_model", "load_text_model", "load_kv_heads_sweep", "load_ffn_norm_ablation",
    "FFNS", "NORM_KINDS",
]


# The bundled files (read by transformer_lib.resources)


def load_text(name: str = TEXT_FILE) -> str:
    """The bundled text ``name`` (by default three of Shakespeare's plays), as one string.

    Args:
        name: a text file in ``transformer_lib/data/``.

    Returns:
        The whole text.
    """
    return data_file(name).read_text(encoding="utf-8")


# Characters <-> ids -------------------------------------------------------------------------


class CharTokenizer:
    """A character-level tokenizer: token id ``i`` is the ``i``-th character of ``chars``.

    Every character is one token, so ``decode(encode(s)) == s`` for any string made of
    known characters; an unknown character raises a ``ValueError`` that names it.

    Args:
        chars: the vocabulary, each character once, in id order.
    """

    def __init__(self, chars: str):
        if not isinstance(chars, str) or not chars:
            raise ValueError(f"chars must be a non-empty string, got {chars!r}")
        if len(set(chars)) != len(chars):
            twice = sorted({c for c in chars if chars.count(c) > 1})
            raise ValueError(f"chars must not repeat a character, got {twice} twice")
        self.chars = chars
        self.ids = {c: i for i, c in enumerate(chars)}
        codes = [ord(c) for c in chars]
        self._table = torch.full((max(codes) + 1,), -1, dtype=torch.long)  # code point -> id
        self._table[torch.tensor(codes)] = torch.arange(len(chars))

    @classmethod
    def from_text(cls, text: str) -> "CharTokenizer":
        """The tokenizer whose vocabulary is the sorted set of characters of ``text``.

        Args:
            text: a non-empty string.

        Returns:
            The tokenizer.
        """
        if not isinstance(text, str) or not text:
            raise ValueError("text must be a non-empty string")
        return cls("".join(sorted(set(text))))

    @property
    def vocab_size(self) -> int:
        """V, the number of characters."""
        return len(self.chars)

    def encode(self, text: str) -> Tensor:
        """Turn a string into token ids, one per character.

        Args:
            text: a string of known characters.

        Returns:
            ``(T,)`` LongTensor of ids, ``T = len(text)``.
        """
        if not isinstance(text, str):
            raise ValueError(f"text must be a string, got {type(text).__name__}")
        if not text:
            return torch.zeros(0, dtype=torch.long)
        # One code point per character (UTF-32), looked up in a table: fast on whole books.
        codes = torch.frombuffer(bytearray(text.encode("utf-32-le")), dtype=torch.int32).long()
        ids = torch.full_like(codes, -1)  # (T,)
        inside = codes < len(self._table)
        ids[inside] = self._table[codes[inside]]
        unknown = (ids < 0).nonzero()
        if len(unknown):
            i = int(unknown[0])
            raise ValueError(f"character {text[i]!r} at position {i} is not in the vocabulary "
                             f"({self.vocab_size} characters)")
        return ids

    def decode(self, ids: Tensor | Sequence[int]) -> str:
        """Turn token ids back into the string they spell.

        Args:
            ids: one sequence of ids ``(T,)``, a tensor or a list of ints.

        Returns:
            The string, ``T`` characters.
        """
        ids = ids.tolist() if isinstance(ids, Tensor) else list(ids)
        if any(isinstance(i, list) for i in ids):
            raise ValueError("decode takes one sequence of ids (T,), not a batch")
        bad = [i for i in ids if not isinstance(i, int) or not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"ids must be integers in [0, {self.vocab_size - 1}], got {bad[0]!r}")
        return "".join(self.chars[i] for i in ids)

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"


# Batches for next-token training ------------------------------------------------------------


def _check_ids(ids: Any, name: str = "ids") -> None:
    if not isinstance(ids, Tensor) or ids.dtype != torch.long or ids.dim() != 1:
        got = (f"shape {tuple(ids.shape)}, {ids.dtype}" if isinstance(ids, Tensor)
               else type(ids).__name__)
        raise ValueError(f"{name} must be a 1-D LongTensor of token ids, got {got}")


def split_ids(ids: Tensor, val_fraction: float = 0.1) -> tuple[Tensor, Tensor]:
    """Cut ids into a training part (the first ``1 - val_fraction``) and a validation part
    (the rest): contiguous, so no window of one overlaps the other.

    Args:
        ids: token ids ``(N,)``.
        val_fraction: the share of the validation part, in (0, 1).

    Returns:
        ``(train, val)``: ``(N - n_val,)`` and ``(n_val,)``.
    """
    _check_ids(ids)
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    n_val = max(1, int(round(len(ids) * val_fraction)))
    if n_val >= len(ids):
        raise ValueError(f"{len(ids)} ids are too few to split with val_fraction={val_fraction}")
    return ids[:-n_val], ids[-n_val:]


def next_token_batch(ids: Tensor, batch_size: int, seq_len: int,
                     generator: torch.Generator | None = None, *,
                     device: torch.device | str | None = None) -> tuple[Tensor, Tensor]:
    """Random windows of ``ids`` for next-token prediction (teacher forcing).

    Args:
        ids: ``(N,)`` LongTensor, the whole text as token ids.
        batch_size, seq_len: ``B`` windows of ``T`` tokens.
        generator: where the window starts come from (None: the global generator). The
            starts are drawn on the generator's device, so a CPU generator picks the same
            windows whatever device the batch goes to.
        device: where the batch goes (None: where ``ids`` are).

    Returns:
        ``(inputs, targets)``, each ``(B, T)`` on ``device``: ``targets[b, t] ==
        inputs[b, t + 1]``, the token that follows ``inputs[b, t]`` in the text.
    """
    _check_ids(ids)
    if batch_size < 1 or seq_len < 1:
        raise ValueError(f"batch_size ({batch_size}) and seq_len ({seq_len}) must be positive")
    if len(ids) < seq_len + 1:
        raise ValueError(f"windows of seq_len + 1 = {seq_len + 1} tokens need at least that "
                         f"many ids, got {len(ids)}")
    starts = torch.randint(0, len(ids) - seq_len, (batch_size,), generator=generator,
                           device=None if generator is None else generator.device)  # (B,)
    offsets = torch.arange(seq_len + 1, device=ids.device)  # (T + 1,)
    windows = ids[starts.to(ids.device)[:, None] + offsets]  # (B, T + 1)
    windows = windows.to(ids.device if device is None else device)
    return windows[:, :-1], windows[:, 1:]  # (B, T) each, shifted by one


# The model and its training -----------------------------------------------------------------


def text_config(vocab_size: int, **overrides) -> DecoderConfig:
    """The small decoder the chapter trains on the bundled text: ``d_model`` 64, 2 layers,
    4 query heads sharing 2 key/value heads, SwiGLU width 172 (about 8/3 · 64), room for
    256 positions, tied embeddings.

    Args:
        vocab_size: V, the tokenizer's.
        **overrides: fields of :class:`~transformer_lib.decoder.DecoderConfig` to set
            instead of the defaults.

    Returns:
        The config.
    """
    fields = dict(vocab_size=vocab_size, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
                  d_ff=172, max_seq_len=256, tie_embeddings=True)
    check_overrides(DecoderConfig, overrides)
    fields.update(overrides)
    return DecoderConfig(**fields)


def _swap_parts(model: Decoder, ffn: str, norm: str) -> Decoder:
    """Replace SwiGLU by a bias-free ReLU FFN of the same parameters (width 3/2 · d_ff) and
    RMSNorm by LayerNorm (which adds a bias of C per norm); the new FFN is initialised as the
    Decoder initialises its own (N(0, 0.02)), every other weight is kept."""
    c = model.config
    for block in model.layers:
        if ffn == "relu":
            block.mlp = FeedForward(c.d_model, 3 * c.d_ff // 2, bias=False)
            block.mlp.apply(init_weights)
        if norm == "layer":
            block.input_layernorm = LayerNorm(c.d_model, c.norm_eps)
            block.post_attention_layernorm = LayerNorm(c.d_model, c.norm_eps)
    if norm == "layer":
        model.norm = LayerNorm(c.d_model, c.norm_eps)
    return model


def _lr_at(step: int, steps: int, lr: float, warmup: int, min_lr: float) -> float:
    """Linear warm-up to ``lr`` over ``warmup`` steps, then a cosine decay to ``min_lr`` at
    the last step (``step`` counts from 1)."""
    if step <= warmup:  # warmup > 0 here
        return lr * step / warmup
    progress = (step - warmup) / max(1, steps - warmup)  # 0 ... 1
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def train_text_model(config: DecoderConfig, train_ids: Tensor, *, steps: int = 300,
                     batch_size: int = 32, seq_len: int = 64, lr: float = 3e-3,
                     warmup: int = 30, min_lr: float | None = None,
                     weight_decay: float = 0.0, grad_clip: float = 1.0, seed: int = 0,
                     val_ids: Tensor | None = None, eval_every: int = 0,
                     device: torch.device | str | None = None, ffn: str = "swiglu",
                     norm: str = "rms") -> tuple[Decoder, dict[str, Any]]:
    """Train a :class:`~transformer_lib.decoder.Decoder` to predict the next token of
    ``train_ids``.

    AdamW (β = 0.9, 0.99) with a linear warm-up to ``lr`` over ``warmup`` steps and a cosine
    decay to ``min_lr`` (default ``lr / 10``), gradients clipped to norm ``grad_clip``, fresh
    random windows every step (:func:`next_token_batch`), the cross-entropy of every position
    (teacher forcing). Seeded by ``seed``; the global random state is left as it was. The
    initial weights and the windows come from CPU generators, so they are the same on every
    device.

    Args:
        config: the model; its ``vocab_size`` must exceed every id.
        train_ids: ``(N,)`` LongTensor, the training text as ids.
        steps: optimizer updates.
        batch_size: windows per update, B.
        seq_len: tokens per window, T.
        lr: the peak learning rate.
        warmup: steps of the linear warm-up.
        min_lr: the learning rate at the last step; None means ``lr / 10``.
        weight_decay: AdamW's weight decay.
        grad_clip: the largest norm of the whole gradient.
        seed: seeds the initial weights and the windows.
        val_ids: optional ``(M,)`` ids; with ``eval_every > 0`` the validation loss
            (:func:`evaluate_loss`) is recorded every ``eval_every`` steps and at the end.
        eval_every: steps between validation losses (0: none).
        device: where the model trains (None: the CPU).
        ffn: ``"swiglu"`` (the Decoder's), or ``"relu"``: a bias-free 2017 FFN of width
            ``3 * d_ff // 2``, the same number of parameters.
        norm: ``"rms"`` (the Decoder's RMSNorm), or ``"layer"``: LayerNorm in the same places.

    Returns:
        ``(model, history)``: the model in eval mode on ``device``, and ``{"step", "loss",
        "lr", "val_step", "val_loss", "seconds"}``: one training loss and learning rate per
        step (lists), the validation losses with their steps (lists), and the training time
        in seconds (a float).
    """
    if not isinstance(config, DecoderConfig):
        raise ValueError(f"config must be a DecoderConfig, got {type(config).__name__}")
    _check_ids(train_ids, "train_ids")
    if val_ids is not None:
        _check_ids(val_ids, "val_ids")
    for name, ids in (("train_ids", train_ids), ("val_ids", val_ids)):
        if ids is not None and int(ids.max()) >= config.vocab_size:
            raise ValueError(f"{name} holds id {int(ids.max())}, but the model's vocab_size "
                             f"is {config.vocab_size}")
    if steps < 1 or batch_size < 1 or seq_len < 1:
        raise ValueError(f"steps ({steps}), batch_size ({batch_size}) and seq_len ({seq_len}) "
                         "must be positive")
    if seq_len > config.max_seq_len:
        raise ValueError(f"seq_len ({seq_len}) must be at most max_seq_len ({config.max_seq_len})")
    if not 0 <= warmup < steps:
        raise ValueError(f"warmup ({warmup}) must be in [0, steps - 1 = {steps - 1}]")
    if lr <= 0 or grad_clip <= 0 or weight_decay < 0:
        raise ValueError(f"lr ({lr}) and grad_clip ({grad_clip}) must be positive and "
                         f"weight_decay ({weight_decay}) non-negative")
    if eval_every < 0 or (eval_every and val_ids is None):
        raise ValueError(f"eval_every ({eval_every}) must be >= 0, and needs val_ids")
    for name, value, choices in (("ffn", ffn, FFNS), ("norm", norm, NORM_KINDS)):
        if value not in choices:
            raise ValueError(f"{name} ({value!r}) must be one of {choices}")
    min_lr = lr / 10 if min_lr is None else min_lr
    device = torch.device("cpu" if device is None else device)
    gen = torch.Generator().manual_seed(seed)  # the training windows, drawn on the CPU
    train_ids = train_ids.to(device)
    history: dict[str, Any] = {"step": [], "loss": [], "lr": [], "val_step": [],
                               "val_loss": []}
    start = time.perf_counter()
    with torch.random.fork_rng(devices=[]):  # initialisation leaves no trace
        torch.manual_seed(seed)
        model = Decoder(config)
        if (ffn, norm) != ("swiglu", "rms"):
            model = _swap_parts(model, ffn, norm)
        model = model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.99),
                                  weight_decay=weight_decay)
    model.train()
    for step in range(1, steps + 1):
        rate = _lr_at(step, steps, lr, warmup, min_lr)
        for group in optimizer.param_groups:
            group["lr"] = rate
        inputs, targets = next_token_batch(train_ids, batch_size, seq_len, gen)  # (B, T)
        logits = model(inputs)  # (B, T, V)
        loss = F.cross_entropy(logits.reshape(-1, config.vocab_size), targets.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        history["step"].append(step)
        history["loss"].append(loss.item())
        history["lr"].append(rate)
        if eval_every and (step % eval_every == 0 or step == steps):
            history["val_step"].append(step)
            history["val_loss"].append(evaluate_loss(model, val_ids, seq_len))
            model.train()
    history["seconds"] = time.perf_counter() - start
    return model.eval(), history


@torch.no_grad()
def evaluate_loss(model: Decoder, ids: Tensor, seq_len: int = 64, batch_size: int = 64,
                  max_windows: int | None = None) -> float:
    """Mean next-token cross-entropy (nats per token) of ``model`` over ``ids``.

    Deterministic: ``ids`` is cut into consecutive windows of ``seq_len + 1`` tokens that
    overlap by one (the last token of a window is the first input of the next), at most
    ``max_windows`` of them, and every position of every window is scored. The model is
    left in eval mode.

    Args:
        model: the decoder.
        ids: token ids ``(N,)``.
        seq_len: T, the positions of a window.
        batch_size: windows per forward pass.
        max_windows: the most windows scored (None: all).

    Returns:
        The mean loss in nats per token.
    """
    _check_ids(ids)
    if seq_len < 1 or batch_size < 1:
        raise ValueError(f"seq_len ({seq_len}) and batch_size ({batch_size}) must be positive")
    n_windows = (len(ids) - 1) // seq_len
    if n_windows < 1:
        raise ValueError(f"evaluation needs at least seq_len + 1 = {seq_len + 1} ids, "
                         f"got {len(ids)}")
    if max_windows is not None:
        n_windows = min(n_windows, max_windows)
    starts = torch.arange(n_windows, device=ids.device) * seq_len  # (W,)
    windows = ids[starts[:, None] + torch.arange(seq_len + 1, device=ids.device)]  # (W, T + 1)
    windows = windows.to(model.embed_tokens.weight.device)  # where the model is
    model.eval()
    total, count = 0.0, 0
    for batch in windows.split(batch_size):
        logits = model(batch[:, :-1])  # (b, T, V)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1),
                               reduction="sum")
        total += loss.item()
        count += batch[:, 1:].numel()
    return total / count


@torch.no_grad()
def generate_text(model: Decoder, tokenizer: CharTokenizer, prompt: str, max_new_tokens: int,
                  temperature: float = 0.0, top_k: int | None = None, seed: int = 0,
                  top_p: float | None = None) -> str:
    """``prompt`` followed by ``max_new_tokens`` characters from ``model``: greedy when
    ``temperature`` is 0, else sampled (restricted by ``top_k`` and ``top_p`` if given, as in
    :func:`~transformer_lib.sampling.sample_next_token`) with a generator seeded by ``seed``
    on the model's device (the same seed draws different characters on a CPU and a GPU).

    Args:
        model: the decoder.
        tokenizer: its tokenizer.
        prompt: at least one known character.
        max_new_tokens: characters to add.
        temperature: 0 for greedy decoding, else the sampling temperature.
        top_k: keep only the ``top_k`` most likely characters (None: all).
        seed: seeds the sampling generator.
        top_p: keep the most likely characters whose probabilities add up to ``top_p``.

    Returns:
        ``prompt`` and the generated characters.
    """
    if not prompt:
        raise ValueError("the prompt must hold at least one character")
    device = model.embed_tokens.weight.device
    tokens = tokenizer.encode(prompt)[None, :].to(device)  # (1, T)
    gen = torch.Generator(device=device).manual_seed(seed)
    out = model.generate(tokens, max_new_tokens, temperature=temperature, top_k=top_k,
                         top_p=top_p, generator=gen)  # (1, T + max_new_tokens)
    return tokenizer.decode(out[0])


# The checkpoint -----------------------------------------------------------------------------


def save_text_model(path: str | os.PathLike, model: Decoder, tokenizer: CharTokenizer,
                    **info: Any) -> None:
    """Save ``model`` (fp32 weights and its config), ``tokenizer``'s characters and ``info``
    (plain numbers, strings, lists and dicts: how it was trained, its losses) to ``path``.

    Args:
        path: the file to write.
        model: the decoder.
        tokenizer: its tokenizer (the same ``vocab_size``).
        **info: what to store beside the weights.
    """
    if model.config.vocab_size != tokenizer.vocab_size:
        raise ValueError(f"the model's vocab_size ({model.config.vocab_size}) differs from the "
                         f"tokenizer's ({tokenizer.vocab_size})")
    state = {name: t.detach().float().cpu().contiguous() for name, t in model.state_dict().items()}
    if model.config.tie_embeddings:
        state.pop("lm_head.weight")  # the same matrix as embed_tokens.weight
    torch.save({"format": CHECKPOINT_FORMAT, "config": dataclasses.asdict(model.config),
                "chars": tokenizer.chars, "state_dict": state, "info": info}, path)


def load_text_model(path: str | os.PathLike | None = None
                    ) -> tuple[Decoder, CharTokenizer, dict[str, Any]]:
    """Load a checkpoint written by :func:`save_text_model`; by default the bundled one,
    ``tiny_lm.pt``, which ``bench/train_text_model.py`` trained on the bundled text.

    Args:
        path: the checkpoint; None means the bundled one.

    Returns:
        ``(model, tokenizer, info)``: the model in eval mode on the CPU, its tokenizer, and
        what the training script stored (``info["val_loss"]`` is the validation loss that
        :func:`evaluate_loss` gives with ``info["seq_len"]``).
    """
    if path is None:
        source = f"the bundled checkpoint {CHECKPOINT_FILE}"
        with data_file(CHECKPOINT_FILE).open("rb") as f:
            saved = torch.load(f, map_location="cpu", weights_only=True)
    else:
        source = os.fspath(path)
        saved = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(saved, dict) or saved.get("format") != CHECKPOINT_FORMAT:
        found = saved.get("format") if isinstance(saved, dict) else type(saved).__name__
        raise ValueError(f"{source} is not a text-model checkpoint of format "
                         f"{CHECKPOINT_FORMAT} (found {found!r})")
    config = DecoderConfig(**saved["config"])
    tokenizer = CharTokenizer(saved["chars"])
    with torch.random.fork_rng(devices=[]):  # the initial values are overwritten anyway
        model = Decoder(config)
    state = dict(saved["state_dict"])
    if config.tie_embeddings:
        state["lm_head.weight"] = state["embed_tokens.weight"]
    model.load_state_dict(state)
    return model.eval(), tokenizer, dict(saved["info"])


def load_kv_heads_sweep() -> dict[str, Any]:
    """The saved MHA / GQA / MQA comparison of ``bench/train_text_model.py --sweep``: the
    shared settings, and for each number of key/value heads the validation loss of every
    seed, their mean and standard deviation, and the parameters and KV-cache bytes.

    Returns:
        The parsed JSON file.
    """
    return load_json(SWEEP_FILE)


def load_ffn_norm_ablation() -> dict[str, Any]:
    """The saved SwiGLU-vs-ReLU and RMSNorm-vs-LayerNorm comparison of
    ``bench/ffn_norm_ablation.py``: the shared settings, and for each variant (``"swiglu+rms"``
    and so on) its parameters and the final training and validation loss of every seed.

    Returns:
        The parsed JSON file.
    """
    return load_json(FFN_NORM_FILE)
