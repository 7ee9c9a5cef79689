"""Drawn diagrams of how tensors flow through attention, with their shapes: one head from X to
its output (chapter 1), the encoder–decoder and its cross-attention (chapter 2), and the
split of a layer into heads and their merge (chapter 3).

Each matrix is a box whose rows stand for positions, labelled with its name and its shape in
the course's letters (``appendix/notation.md``); arrows carry the operation. Every box and
arrow is a matplotlib patch with a gid (tests read the diagrams back from them), so a diagram
renders alike in the book (SVG), in Jupyter and in Colab, and its smallest text, 10 pt on a
5.4 inch figure, stays 9 CSS px on a phone.
"""
from __future__ import annotations

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Rectangle

from transformer_lib.plotting.diagrams import _FILL_ALPHA, _rgb
from transformer_lib.plotting.style import (
    BLACK,
    BLUE,
    GREY,
    MASK_BLOCKED,
    MASK_VISIBLE,
    ORANGE,
    PURPLE,
    RUN_COLOURS,
    SKY_BLUE,
    VALUE_SIZE,
    new_axes,
)


def _fill(colour: str) -> tuple[float, float, float, float]:
    """A box's fill: the colour, light enough for black text (as in :mod:`.diagrams`)."""
    return (*_rgb(colour), _FILL_ALPHA)


def _matrix(ax: Axes, x: float, y: float, w: float, h: float, name: str, shape: str, *,
            colour: str, rows: int = 0, gid: str | None = None,
            name_inside: bool = True) -> None:
    """A matrix centred at (x, y), ``w`` by ``h`` data units: ``rows`` faint lines between
    its rows (positions), its name inside (or above) and its shape below."""
    box = Rectangle((x - w / 2, y - h / 2), w, h, facecolor=_fill(colour), edgecolor=BLACK,
                    lw=1.0)
    box.set_gid(gid or name)
    ax.add_patch(box)
    for r in range(1, rows):
        yr = y - h / 2 + r * h / rows
        ax.plot([x - w / 2, x + w / 2], [yr, yr], color=BLACK, lw=0.4, alpha=0.35)
    if name_inside:
        ax.text(x, y, name, ha="center", va="center", fontsize=VALUE_SIZE)
    else:
        ax.text(x, y + h / 2 + 0.08, name, ha="center", va="bottom", fontsize=VALUE_SIZE)
    ax.text(x, y - h / 2 - 0.08, shape, ha="center", va="top", fontsize=VALUE_SIZE)


def _arrow(ax: Axes, start: tuple[float, float], end: tuple[float, float], gid: str,
           text: str = "", *, at: tuple[float, float] | None = None,
           colour: str = BLACK) -> None:
    """An arrow from ``start`` to ``end``; ``text`` centred at ``at`` (default: the middle,
    a little above)."""
    patch = FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=10, lw=1.1,
                            color=colour, shrinkA=0, shrinkB=0)
    patch.set_gid(gid)
    ax.add_patch(patch)
    if text:
        where = at or ((start[0] + end[0]) / 2, (start[1] + end[1]) / 2 + 0.22)
        ax.text(*where, text, ha="center", va="center", fontsize=VALUE_SIZE)


def attention_flow(*, causal: bool = True, ax: Axes | None = None) -> tuple[Figure, Axes]:
    """One head of attention, left to right: X → Q, K, V (three projections) → the scores
    Q Kᵀ / √D → mask and softmax, row by row → the weights times V → the output, each matrix
    with its shape, drawn with T = S = 4 rows (self-attention).

    Args:
        causal: shade the weights above the diagonal as blocked (a causal mask); False draws
            every weight.
        ax: Axes to draw on; a new 5.4 x 2.9 inch figure is created when None.

    Returns:
        (fig, ax). Boxes have gids ``"X"``, ``"Q"``, ``"K"``, ``"V"``, ``"scores"``,
        ``"weights"``, ``"out"``; arrows ``"X->Q"``, ``"X->K"``, ``"X->V"``, ``"Q->scores"``,
        ``"K->scores"``, ``"scores->weights"``, ``"weights->out"``, ``"V->out"``; with
        ``causal`` the blocked cells of the weights are ``"blocked i,j"``.
    """
    fig, ax = new_axes(ax, figsize=(5.4, 2.9))
    n = 4  # positions drawn
    _matrix(ax, 0.55, 2.2, 0.8, 1.6, "$X$", "(T, C)", colour=GREY, rows=n, gid="X")
    rows = {"Q": 3.55, "K": 2.2, "V": 0.85}
    for name, y in rows.items():
        _matrix(ax, 2.75, y, 0.55, 0.9, f"${name}$", "(T, D)" if name == "Q" else "(S, D)",
                colour=ORANGE if name != "V" else PURPLE, rows=n, gid=name)
        _arrow(ax, (0.95, 2.2 + (y - 2.2) * 0.25), (2.475, y), f"X->{name}",
               f"$W_{name}$", at=(1.75, 2.2 + (y - 2.2) * 0.62 + 0.2))
    _matrix(ax, 4.85, 3.0, 0.9, 0.9, r"$QK^\top\!/\sqrt{D}$", "(T, S)", colour=SKY_BLUE,
            rows=0, gid="scores", name_inside=False)
    _arrow(ax, (3.025, 3.55), (4.4, 3.2), "Q->scores")
    _arrow(ax, (3.025, 2.2), (4.4, 2.8), "K->scores")
    # The weights as a grid of T x S cells, the blocked ones (causal) pale.
    left, bottom, cell = 6.55, 2.55, 0.225
    for i in range(n):
        for j in range(n):
            blocked = causal and j > i
            patch = Rectangle((left + j * cell, bottom + (n - 1 - i) * cell), cell, cell,
                              facecolor=MASK_BLOCKED if blocked else _fill(MASK_VISIBLE),
                              edgecolor=BLACK, lw=0.5)
            patch.set_gid(f"blocked {i},{j}" if blocked else f"weight {i},{j}")
            ax.add_patch(patch)
    frame = Rectangle((left, bottom), n * cell, n * cell, fill=False, edgecolor=BLACK, lw=1.0)
    frame.set_gid("weights")
    ax.add_patch(frame)
    ax.text(left + n * cell / 2, bottom + n * cell + 0.08, "weights", ha="center",
            va="bottom", fontsize=VALUE_SIZE)
    ax.text(left + n * cell / 2, bottom - 0.08, "(T, S)", ha="center", va="top",
            fontsize=VALUE_SIZE)
    _arrow(ax, (5.3, 3.0), (left - 0.05, 3.0), "scores->weights",
           "mask,\nsoftmax" if causal else "softmax", at=(5.92, 2.55))
    ax.text(left + n * cell / 2, bottom - 0.52, "each row sums to 1", ha="center",
            va="top", fontsize=VALUE_SIZE)
    _matrix(ax, 8.95, 1.35, 0.55, 0.9, "out", "(T, D)", colour=BLUE, rows=n, gid="out")
    _arrow(ax, (left + n * cell, 2.75), (8.675, 1.65), "weights->out")
    _arrow(ax, (3.025, 0.85), (8.675, 1.15), "V->out", "weights $\\times$ $V$",
           at=(6.0, 0.72))
    ax.set_xlim(0, 9.5)
    ax.set_ylim(0.05, 4.45)
    ax.axis("off")
    return fig, ax


def head_split_flow(n_heads: int = 4, *, ax: Axes | None = None) -> tuple[Figure, Axes]:
    """How a layer splits into heads and merges back, left to right: Q ``(B, T, C)`` with its
    C channels in ``n_heads`` groups of D → ``view`` and ``transpose`` to ``(B, H, T, D)``,
    one slab per head → attention in each head on its own → ``transpose`` and ``reshape`` back
    to ``(B, T, C)``, the heads side by side in the channels again → ``W_O``. Each head keeps
    its colour, so the merge puts every head's channels back where its split took them.

    Args:
        n_heads: H, heads drawn (2 to 6).
        ax: Axes to draw on; a new 5.4 x 2.9 inch figure is created when None.

    Returns:
        (fig, ax). Gids: ``"Q channels h"`` and ``"merged channels h"`` for head h's D channels
        before the split and after the merge, ``"head h"`` and ``"head h out"`` for its slab
        before and after attention, ``"out"`` for the output after ``W_O``.
    """
    if not 2 <= n_heads <= 6:
        raise ValueError(f"n_heads must be in 2 ... 6, got {n_heads}")
    fig, ax = new_axes(ax, figsize=(5.4, 2.9))
    colours = [RUN_COLOURS[h % len(RUN_COLOURS)] for h in range(n_heads)]

    def channels(x: float, label: str, gid: str) -> None:
        """A (T, C) matrix drawn as H coloured groups of D channels."""
        w, h = 1.1, 1.2
        for head in range(n_heads):
            part = Rectangle((x - w / 2 + head * w / n_heads, 2.2 - h / 2), w / n_heads, h,
                             facecolor=_fill(colours[head]), edgecolor=BLACK, lw=0.6)
            part.set_gid(f"{gid} {head}")
            ax.add_patch(part)
        ax.text(x, 2.2 + h / 2 + 0.08, label, ha="center", va="bottom", fontsize=VALUE_SIZE)
        ax.text(x, 2.2 - h / 2 - 0.08, "(B, T, C)", ha="center", va="top",
                fontsize=VALUE_SIZE)

    def slabs(x: float, gid: str, label: str) -> None:  # gid: "head {}" or "head {} out"
        """H separate (T, D) matrices, one per head, stacked with an offset."""
        w, h, step = 0.42, 0.75, 0.28
        for head in range(n_heads):
            y = 2.2 + (n_heads - 1) * step / 2 - head * step
            part = Rectangle((x - w / 2 + head * 0.07, y - h / 2), w, h,
                             facecolor=_fill(colours[head]), edgecolor=BLACK, lw=0.6)
            part.set_gid(gid.format(head))
            ax.add_patch(part)
        top = 2.2 + (n_heads - 1) * step / 2 + h / 2
        ax.text(x + 0.1, top + 0.08, label, ha="center", va="bottom", fontsize=VALUE_SIZE)
        ax.text(x + 0.1, 2.2 - (n_heads - 1) * step / 2 - h / 2 - 0.08, "(B, H, T, D)",
                ha="center", va="top", fontsize=VALUE_SIZE)

    channels(0.75, "$Q$", "Q channels")
    _arrow(ax, (1.35, 2.2), (2.6, 2.2), "split", "view,\ntranspose", at=(1.95, 1.6))
    slabs(3.05, "head {}", "heads")
    _arrow(ax, (3.7, 2.2), (4.75, 2.2), "attend", "attention,\neach head", at=(4.22, 1.6))
    slabs(5.2, "head {} out", "head outputs")
    _arrow(ax, (5.85, 2.2), (7.0, 2.2), "merge", "transpose,\nreshape", at=(6.38, 1.6))
    channels(7.6, "merged", "merged channels")
    _arrow(ax, (8.2, 2.2), (8.85, 2.2), "project", "$W_O$", at=(8.52, 2.5))
    _matrix(ax, 9.2, 2.2, 0.5, 1.2, "", "", colour=GREY, gid="out")
    ax.text(9.2, 2.2 + 0.68, "out", ha="center", va="bottom", fontsize=VALUE_SIZE)
    ax.text(5.0, 0.45, f"H = {n_heads} groups of D channels. Split and merge are reshapes:\n"
            "nothing is computed, and each head reads only its own channels",
            ha="center", va="center", fontsize=VALUE_SIZE)
    ax.set_xlim(0.05, 9.5)
    ax.set_ylim(0.0, 3.45)
    ax.axis("off")
    return fig, ax


def encoder_decoder_flow(*, ax: Axes | None = None) -> tuple[Figure, Axes]:
    """The 2017 encoder–decoder on sequence reversal: the source goes through the encoder's
    layers (self-attention both ways) into the memory ``(S, C)``; the decoder reads the
    target shifted right, with causal self-attention, and its cross-attention takes its
    queries from the decoder and its keys and values from the memory; a linear layer gives
    the logits ``(T, V)``.

    Args:
        ax: Axes to draw on; a new 5.4 x 3.2 inch figure is created when None.

    Returns:
        (fig, ax). Gids: ``"source"``, ``"encoder self-attention"``, ``"memory"``,
        ``"target in"``, ``"decoder self-attention"``, ``"cross-attention"``, ``"logits"``,
        and the arrows ``"memory->cross K, V"`` and ``"decoder->cross Q"``.
    """
    fig, ax = new_axes(ax, figsize=(5.4, 3.2))

    def block(x: float, y: float, text: str, colour: str, gid: str, w: float = 2.2) -> None:
        box = Rectangle((x - w / 2, y - 0.3), w, 0.6, facecolor=_fill(colour),
                        edgecolor=BLACK, lw=1.0)
        box.set_gid(gid)
        ax.add_patch(box)
        ax.text(x, y, text, ha="center", va="center", fontsize=VALUE_SIZE)

    def label(x: float, y: float, text: str, gid: str) -> None:
        ax.text(x, y, text, ha="center", va="center", fontsize=VALUE_SIZE, gid=gid)

    # Encoder, left column, bottom to top.
    label(1.6, 0.35, "source  3 1 4 1 5  (S)", "source")
    block(1.6, 1.45, "self-attention both\nways, FFN", ORANGE, "encoder self-attention",
          w=2.3)
    ax.text(2.85, 1.45, "× N", ha="left", va="center", fontsize=VALUE_SIZE)
    _arrow(ax, (1.6, 0.55), (1.6, 1.15), "source->encoder")
    block(1.6, 2.85, "memory  (S, C)", GREY, "memory", w=2.3)
    _arrow(ax, (1.6, 1.75), (1.6, 2.55), "encoder->memory")
    label(1.6, 3.75, "encoder: the whole\nsource, both ways", "encoder note")
    # Decoder, right column.
    label(6.4, 0.35, "target in  <s> 5 1 4 1  (T)", "target in")
    block(6.4, 1.45, "causal self-attention", ORANGE, "decoder self-attention", w=2.5)
    _arrow(ax, (6.4, 0.55), (6.4, 1.15), "target->decoder")
    block(6.4, 2.85, "cross-attention, FFN", SKY_BLUE, "cross-attention", w=2.5)
    ax.plot([7.8, 7.95, 7.95, 7.8], [1.15, 1.15, 3.15, 3.15], color=BLACK, lw=0.8)
    ax.text(8.05, 2.15, "× N", ha="left", va="center", fontsize=VALUE_SIZE)
    _arrow(ax, (6.4, 1.75), (6.4, 2.55), "decoder->cross Q", "$Q$", at=(6.65, 2.15))
    _arrow(ax, (2.75, 2.85), (5.15, 2.85), "memory->cross K, V", "$K$, $V$ from\nthe memory",
           at=(3.95, 3.3))
    block(6.4, 4.15, "logits  (T, V)", BLUE, "logits", w=2.0)
    _arrow(ax, (6.4, 3.15), (6.4, 3.85), "cross->logits", "linear", at=(6.95, 3.5))
    ax.set_xlim(0.2, 8.7)
    ax.set_ylim(0.05, 4.6)
    ax.axis("off")
    return fig, ax
