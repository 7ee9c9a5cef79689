"""Drawn diagrams: the three layer structures side by side, and how grouped-query attention
shares key/value heads.

Boxes, circles and arrows are matplotlib patches, so a diagram renders the same in the book
(SVG), in Jupyter and in Colab. Boxes are coloured by kind (attention, norm, feed-forward,
residual sum) with ``RUN_COLOURS`` and also carry their names, so no colour has to be told
apart to read them.
"""
from __future__ import annotations

from typing import Sequence

from matplotlib.axes import Axes
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import Ellipse, FancyArrowPatch, FancyBboxPatch

from transformer_lib.plotting.style import (
    BLACK,
    BLUE,
    GREY,
    LABEL_SIZE,
    ORANGE,
    PURPLE,
    SKY_BLUE,
    TITLE_SIZE,
    VALUE_SIZE,
    new_axes,
)

#: Fill colours by kind of box, light enough for black text.
KIND_COLOURS = {"attention": ORANGE, "norm": SKY_BLUE, "ffn": PURPLE, "sum": "white"}
_FILL_ALPHA = 0.35
_BOX_W, _BOX_H, _GAP = 0.76, 0.40, 0.20  # data units; a column is 1 unit wide
_SUM_R = 0.11  # half the height of a residual-sum circle (y units)
_SUM_RX = 0.06  # half its width: an x unit is about 1.8 times a y unit on the page

#: The three structures, bottom to top: (label, kind). Residuals: (from, to) = a path from
#: the input of item `from` to item `to`.
LAYERS = {
    "2017 encoder layer": (
        [("self-attention\n(both ways)", "attention"), ("add & LayerNorm", "norm"),
         ("FFN (ReLU)", "ffn"), ("add & LayerNorm", "norm")],
        [(0, 1), (2, 3)],
    ),
    "2017 decoder layer": (
        [("causal\nself-attention", "attention"), ("add & LayerNorm", "norm"),
         ("cross-attention\nto the encoder", "attention"), ("add & LayerNorm", "norm"),
         ("FFN (ReLU)", "ffn"), ("add & LayerNorm", "norm")],
        [(0, 1), (2, 3), (4, 5)],
    ),
    "decoder-only block": (
        [("RMSNorm", "norm"), ("causal self-attn\nGQA + RoPE", "attention"), ("+", "sum"),
         ("RMSNorm", "norm"), ("SwiGLU", "ffn"), ("+", "sum")],
        [(0, 2), (3, 5)],
    ),
}


def _arrow(ax: Axes, start: tuple[float, float], end: tuple[float, float],
           gid: str | None = None, colour: str = BLACK, connection: str = "arc3") -> None:
    patch = FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=9, lw=1.1,
                            color=colour, shrinkA=0, shrinkB=0, connectionstyle=connection)
    patch.set_gid(gid)
    ax.add_patch(patch)


def _box(ax: Axes, x: float, y: float, label: str, kind: str, gid: str) -> None:
    """A labelled box (or a circle for a residual sum) centred at ``(x, y)``."""
    if kind == "sum":
        patch = Ellipse((x, y), 2 * _SUM_RX, 2 * _SUM_R, facecolor="white", edgecolor=BLACK,
                        lw=1.1)
        ax.text(x, y, "+", ha="center", va="center", fontsize=LABEL_SIZE)
    else:
        patch = FancyBboxPatch((x - _BOX_W / 2, y - _BOX_H / 2), _BOX_W, _BOX_H,
                               boxstyle="round,pad=0,rounding_size=0.05", lw=1.0,
                               facecolor=(*_rgb(KIND_COLOURS[kind]), _FILL_ALPHA),
                               edgecolor=BLACK)
        ax.text(x, y, label, ha="center", va="center", fontsize=VALUE_SIZE, linespacing=1.0)
    patch.set_gid(gid)
    ax.add_patch(patch)


def _rgb(colour: str) -> tuple[float, float, float]:
    return to_rgb(colour)


def _half(kind: str) -> float:
    return _SUM_R if kind == "sum" else _BOX_H / 2


def _column(ax: Axes, x: float, title: str, items: Sequence[tuple[str, str]],
            residuals: Sequence[tuple[int, int]], top: float) -> list[float]:
    """One layer structure, drawn bottom to top from y = 0.3, its title above ``top``;
    returns the centres of its items."""
    ys, y = [], 0.55 + _half(items[0][1])
    for i, (_, kind) in enumerate(items):  # centres, bottom to top
        ys.append(y)
        if i + 1 < len(items):
            y += _half(kind) + _GAP + _half(items[i + 1][1])
    _arrow(ax, (x, 0.3), (x, ys[0] - _half(items[0][1])))  # the input
    for i, ((label, kind), yc) in enumerate(zip(items, ys)):
        _box(ax, x, yc, label, kind, gid=f"{title}: {label}")
        if i + 1 < len(items):
            _arrow(ax, (x, yc + _half(kind)), (x, ys[i + 1] - _half(items[i + 1][1])))
    _arrow(ax, (x, ys[-1] + _half(items[-1][1])), (x, ys[-1] + _half(items[-1][1]) + 0.25))
    side = x - _BOX_W / 2 - 0.08  # the residual path runs left of the boxes
    for start, end in residuals:
        y0 = ys[start] - _half(items[start][1]) - _GAP / 2  # on the input arrow
        y1, kind = ys[end], items[end][1]
        tip = x - (_SUM_RX if kind == "sum" else _BOX_W / 2)
        ax.plot([x, side, side], [y0, y0, y1], color=GREY, lw=1.1)
        _arrow(ax, (side, y1), (tip, y1), gid=f"{title}: residual {start}->{end}", colour=GREY)
    ax.text(x, top, title, ha="center", va="bottom", fontsize=LABEL_SIZE, weight="bold")
    return ys


def layer_structures(*, ax: Axes | None = None) -> tuple[Figure, Axes]:
    """The 2017 encoder layer, the 2017 decoder layer and the decoder-only (pre-norm) block,
    side by side, input at the bottom; grey arrows are the residual paths.

    Args:
        ax: Axes to draw on; a new 5.4 x 4.6 inch figure is created when None.

    Returns:
        (fig, ax). Every box and arrow patch has a gid: ``"<column>: <label>"`` for a box
        (``"+"`` for a residual sum) and ``"<column>: residual i->j"`` for the residual path
        from the input of item i to item j (items counted from the bottom).
    """
    fig, ax = new_axes(ax, figsize=(5.4, 4.6))
    top = 4.55
    centres = [_column(ax, x, title, items, residuals, top)
               for x, (title, (items, residuals)) in zip((0.5, 1.5, 2.5), LAYERS.items())]
    y_cross = centres[1][2]  # the encoder's output comes into the cross-attention
    _arrow(ax, (2.0, y_cross), (1.5 + _BOX_W / 2, y_cross), gid="encoder output")
    ax.set_xlim(-0.02, 3.02)
    ax.set_ylim(0.1, top + 0.3)
    ax.set_aspect("auto")
    ax.axis("off")
    return fig, ax


def gqa_heads(n_heads: int = 8, n_kv_heads: int = 2, *,
              ax: Axes | None = None) -> tuple[Figure, Axes]:
    """Which key/value head each query head reads in grouped-query attention: query head h
    reads key/value head ``h // (n_heads / n_kv_heads)`` (consecutive groups, as
    :func:`transformer_lib.attention.repeat_kv`).

    Args:
        n_heads: H, query heads (1 to 16).
        n_kv_heads: H_kv, key/value heads; must divide ``n_heads``.
        ax: Axes to draw on; a new 5.4 x 2.2 inch figure is created when None.

    Returns:
        (fig, ax). The line from query head h to its key/value head j has gid ``"q{h}->kv{j}"``;
        the boxes ``"q{h}"`` and ``"kv{j}"``.
    """
    if not 1 <= n_heads <= 16 or n_kv_heads < 1 or n_heads % n_kv_heads != 0:
        raise ValueError(f"n_heads ({n_heads}) must be in 1 ... 16 and a multiple of "
                         f"n_kv_heads ({n_kv_heads})")
    fig, ax = new_axes(ax, figsize=(5.4, 2.2))
    n_rep = n_heads // n_kv_heads
    colours = [BLUE, ORANGE, PURPLE, SKY_BLUE, GREY]
    width = min(0.8, 0.9 * 8 / n_heads)
    q_x = [1.2 + (h + 0.5) * 8 / n_heads for h in range(n_heads)]  # query heads over 1.2 ... 9.2
    kv_x = [sum(q_x[j * n_rep:(j + 1) * n_rep]) / n_rep for j in range(n_kv_heads)]
    for h, x in enumerate(q_x):
        j = h // n_rep
        colour = colours[j % len(colours)]
        line = FancyArrowPatch((x, 1.55), (kv_x[j], 0.55), arrowstyle="-", lw=1.2,
                               color=colour, shrinkA=0, shrinkB=0)
        line.set_gid(f"q{h}->kv{j}")
        ax.add_patch(line)
        box = FancyBboxPatch((x - width / 2, 1.55), width, 0.4,
                             boxstyle="round,pad=0,rounding_size=0.05", edgecolor=BLACK,
                             facecolor=(*_rgb(colour), _FILL_ALPHA), lw=1.0)
        box.set_gid(f"q{h}")
        ax.add_patch(box)
        ax.text(x, 1.75, f"q{h}", ha="center", va="center", fontsize=VALUE_SIZE)
    kv_width = min(1.6, 0.9 * 8 / n_kv_heads)
    for j, x in enumerate(kv_x):
        colour = colours[j % len(colours)]
        box = FancyBboxPatch((x - kv_width / 2, 0.15), kv_width, 0.4,
                             boxstyle="round,pad=0,rounding_size=0.05", edgecolor=BLACK,
                             facecolor=(*_rgb(colour), _FILL_ALPHA), lw=1.0)
        box.set_gid(f"kv{j}")
        ax.add_patch(box)
        ax.text(x, 0.35, f"K, V {j}", ha="center", va="center", fontsize=VALUE_SIZE)
    ax.text(1.1, 1.75, "query\nheads", ha="right", va="center", fontsize=VALUE_SIZE)
    ax.text(1.1, 0.35, "key/value\nheads", ha="right", va="center", fontsize=VALUE_SIZE)
    ax.text(5.2, 2.1, f"{n_heads} query heads share {n_kv_heads} key/value heads: "
            f"groups of {n_rep}",
            ha="center", va="bottom", fontsize=TITLE_SIZE)
    ax.set_xlim(-0.2, 9.3)
    ax.set_ylim(0.05, 2.45)
    ax.axis("off")
    return fig, ax
