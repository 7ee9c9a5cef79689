"""Drawn diagrams: the three layer structures side by side, how grouped-query attention
shares key/value heads, where the norm sits in a residual block, one round of speculative
decoding, and what attention and linear attention keep per token.

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


#: The two places of the norm in a residual block, bottom to top (as :data:`LAYERS`).
NORM_PLACES = {
    "post-norm (2017)": ([("sublayer", "attention"), ("+", "sum"), ("LayerNorm", "norm")],
                         [(0, 1)]),
    "pre-norm (since)": ([("LayerNorm", "norm"), ("sublayer", "attention"), ("+", "sum")],
                         [(0, 2)]),
}


def norm_placement(*, ax: Axes | None = None) -> tuple[Figure, Axes]:
    """Where the norm sits in a residual block: after the residual sum (post-norm, the 2017
    Transformer), or before the sublayer (pre-norm, most models since), input at the bottom;
    grey arrows are the residual paths.

    Args:
        ax: Axes to draw on; a new 5.4 x 2.7 inch figure is created when None.

    Returns:
        (fig, ax). Boxes have gids ``"<column>: <label>"`` and the residual paths
        ``"<column>: residual i->j"`` (items counted from the bottom), as in
        :func:`layer_structures`.
    """
    fig, ax = new_axes(ax, figsize=(5.4, 2.7))
    top = 2.42
    notes = ("the norm sits on the stream", "the stream skips every norm")
    for x, (title, (items, residuals)), note in zip((0.75, 2.25), NORM_PLACES.items(), notes):
        _column(ax, x, title, items, residuals, top)
        ax.text(x, 0.22, note, ha="center", va="top", fontsize=VALUE_SIZE, color=GREY)
    ax.set_xlim(0.0, 3.0)
    ax.set_ylim(-0.1, top + 0.3)
    ax.set_aspect("auto")
    ax.axis("off")
    return fig, ax


def _token(ax: Axes, x: float, y: float, label: str, colour: str, gid: str, *,
           width: float = 0.94, dashed: bool = False) -> None:
    """A token's box centred at ``(x, y)``, ``width`` x 0.42 data units."""
    patch = FancyBboxPatch((x - width / 2, y - 0.21), width, 0.42,
                           boxstyle="round,pad=0,rounding_size=0.06", lw=1.0,
                           facecolor=(*_rgb(colour), _FILL_ALPHA), edgecolor=BLACK,
                           linestyle="--" if dashed else "-")
    patch.set_gid(gid)
    ax.add_patch(patch)
    ax.text(x, y, label, ha="center", va="center", fontsize=VALUE_SIZE)


def speculative_steps(n_draft: int = 4, n_accepted: int = 2, *,
                      ax: Axes | None = None) -> tuple[Figure, Axes]:
    """One round of speculative decoding: a small model drafts ``n_draft`` tokens one by one,
    the large model scores all of them in one forward pass, the first ``n_accepted`` are kept,
    the next is replaced by a token resampled from the large model, and the rest are dropped
    (when every draft is kept, the pass adds one more token of its own).

    Args:
        n_draft: k, the tokens drafted per round (1 to 6).
        n_accepted: how many drafts the large model accepts (0 to ``n_draft``).
        ax: Axes to draw on; a new 5.4 x 2.4 inch figure is created when None.

    Returns:
        (fig, ax). The drafts have gids ``"draft i"``, the large model's pass ``"verify"``,
        and the outcomes ``"keep i"``, ``"resample i"``, ``"drop i"`` or ``"bonus"``.
    """
    if not 1 <= n_draft <= 6 or not 0 <= n_accepted <= n_draft:
        raise ValueError(f"n_draft ({n_draft}) must be in 1 ... 6 and n_accepted "
                         f"({n_accepted}) in 0 ... n_draft")
    fig, ax = new_axes(ax, figsize=(5.4, 2.4))
    xs = [3.9 + 1.08 * i for i in range(n_draft + 1)]  # drafts, then the pass's own token
    ax.text(0.05, 2.3, "small model:\n$k$ = %d drafts,\none by one" % n_draft,
            ha="left", va="center", fontsize=VALUE_SIZE, linespacing=1.1)
    _token(ax, 2.75, 2.3, "prompt", GREY, "prompt", width=0.95)
    for i, x in enumerate(xs[:n_draft]):
        _token(ax, x, 2.3, f"$d_{i + 1}$", ORANGE, f"draft {i}")
        _arrow(ax, (x, 2.09), (x, 1.57), gid=f"draft {i} -> verify")
    verify = FancyBboxPatch((2.27, 1.15), xs[n_draft - 1] + 0.47 - 2.27, 0.42,
                            boxstyle="round,pad=0,rounding_size=0.06", lw=1.0,
                            facecolor=(*_rgb(SKY_BLUE), _FILL_ALPHA), edgecolor=BLACK)
    verify.set_gid("verify")
    ax.add_patch(verify)
    ax.text((2.27 + xs[n_draft - 1] + 0.47) / 2, 1.36, "large model: one forward pass",
            ha="center", va="center", fontsize=VALUE_SIZE)
    ax.text(0.05, 1.36, "scores every\ndraft at once", ha="left", va="center",
            fontsize=VALUE_SIZE, linespacing=1.1)
    ax.text(0.05, 0.45, "emitted this\nround: %d" % (n_accepted + 1), ha="left", va="center",
            fontsize=VALUE_SIZE, linespacing=1.1)
    for i, x in enumerate(xs[:n_draft]):
        _arrow(ax, (x, 1.15), (x, 0.66), gid=f"verify -> {i}")
        if i < n_accepted:
            _token(ax, x, 0.45, f"keep $d_{i + 1}$", BLUE, f"keep {i}")
        elif i == n_accepted:
            _token(ax, x, 0.45, f"new $t_{i + 1}$", PURPLE, f"resample {i}")
        else:
            _token(ax, x, 0.45, "drop", "white", f"drop {i}", dashed=True)
    if n_accepted == n_draft:
        _token(ax, xs[n_draft], 0.45, f"new $t_{n_draft + 1}$", PURPLE, "bonus")
    ax.set_xlim(0, max(xs[n_draft] + 0.5, 8.7))
    ax.set_ylim(0.1, 2.6)
    ax.axis("off")
    return fig, ax


def state_and_cache(n_steps: int = 5, *, ax: Axes | None = None) -> tuple[Figure, Axes]:
    """What attention and linear attention keep while they read a sequence, step by step:
    attention's KV cache gains one key and one value per token, ``(t, D)`` after t tokens;
    linear attention keeps one state ``S = S + v kᵀ`` of ``(D, D)``, the same size at every
    step.

    Args:
        n_steps: tokens drawn (2 to 8).
        ax: Axes to draw on; a new 5.4 x 2.5 inch figure is created when None.

    Returns:
        (fig, ax). The cache after t tokens has gid ``"cache t"`` (its rows ``"cache t row
        i"``), the state ``"state t"``.
    """
    if not 2 <= n_steps <= 8:
        raise ValueError(f"n_steps ({n_steps}) must be in 2 ... 8")
    fig, ax = new_axes(ax, figsize=(5.4, 2.5))
    row, width, gap = 0.16, 0.5, 0.95
    xs = [2.1 + gap * t for t in range(n_steps)]
    ax.text(0.05, 1.75, "attention:\nthe KV cache\ngrows", ha="left", va="center",
            fontsize=VALUE_SIZE, linespacing=1.1)
    ax.text(0.05, 0.55, "linear attention:\na fixed state", ha="left", va="center",
            fontsize=VALUE_SIZE, linespacing=1.1)
    for t, x in enumerate(xs, start=1):
        ax.text(x, 2.62, f"token {t}", ha="center", va="bottom", fontsize=VALUE_SIZE)
        for i in range(t):  # one row per cached token, stacked downwards from the top
            cell = FancyBboxPatch((x - width / 2, 2.45 - (i + 1) * row), width, row,
                                  boxstyle="square,pad=0", lw=0.6, edgecolor=BLACK,
                                  facecolor=(*_rgb(ORANGE), _FILL_ALPHA))
            cell.set_gid(f"cache {t} row {i}")
            ax.add_patch(cell)
        frame = FancyBboxPatch((x - width / 2, 2.45 - t * row), width, t * row,
                               boxstyle="square,pad=0", lw=1.0, fill=False, edgecolor=BLACK)
        frame.set_gid(f"cache {t}")
        ax.add_patch(frame)
        ax.text(x, 2.45 - t * row - 0.05, f"({t}, D)", ha="center", va="top",
                fontsize=VALUE_SIZE)
        state = FancyBboxPatch((x - width / 2, 0.3), width, width * 1.0,
                               boxstyle="square,pad=0", lw=1.0, edgecolor=BLACK,
                               facecolor=(*_rgb(SKY_BLUE), _FILL_ALPHA))
        state.set_gid(f"state {t}")
        ax.add_patch(state)
        ax.text(x, 0.25, "(D, D)", ha="center", va="top", fontsize=VALUE_SIZE)
        if t > 1:
            _arrow(ax, (xs[t - 2] + width / 2 + 0.02, 0.55), (x - width / 2 - 0.02, 0.55),
                   gid=f"state {t - 1} -> state {t}")
    ax.text((xs[0] + xs[-1]) / 2, 0.97, r"each token: $S \leftarrow S + v\,k^\top$",
            ha="center", va="center", fontsize=VALUE_SIZE)
    ax.set_xlim(0, xs[-1] + 0.4)
    ax.set_ylim(-0.05, 2.95)
    ax.axis("off")
    return fig, ax


def rope_pairings(head_dim: int = 8, *, ax: Axes | None = None) -> tuple[Figure, Axes]:
    """The two ways RoPE pairs the channels of a head: interleaved, channel 2i with 2i + 1,
    and split-half, channel i with i + D/2 (:func:`transformer_lib.positional.pair_channels`).
    The two channels of pair i share a colour and an arc, and turn by the same angle.

    Args:
        head_dim: D, the channels drawn (an even number, 2 to 12).
        ax: Axes to draw on; a new 5.4 x 2.3 inch figure is created when None.

    Returns:
        (fig, ax). Channel boxes have gids ``"<pairing> channel c"``, the arcs
        ``"<pairing> pair i"`` for ``pairing`` in ``"interleaved"`` and ``"half"``.
    """
    from transformer_lib.positional import pair_channels

    if head_dim % 2 or not 2 <= head_dim <= 12:
        raise ValueError(f"head_dim ({head_dim}) must be even and in 2 ... 12")
    fig, ax = new_axes(ax, figsize=(5.4, 2.3))
    colours = [BLUE, ORANGE, PURPLE, SKY_BLUE, GREY, BLACK]
    rows = {"interleaved": (1.75, "interleaved:\n$(2i,\\ 2i+1)$"),
            "half": (0.35, "split-half:\n$(i,\\ i + D/2)$")}
    x0 = 2.6
    for pairing, (y, label) in rows.items():
        ax.text(0.05, y + 0.25, label, ha="left", va="center", fontsize=VALUE_SIZE,
                linespacing=1.2)
        for i in range(head_dim // 2):
            a, b = pair_channels(i, head_dim, pairing)
            colour = colours[i % len(colours)]
            for c in (a, b):
                box = FancyBboxPatch((x0 + c - 0.4, y), 0.8, 0.5, boxstyle="square,pad=0",
                                     lw=1.0, edgecolor=BLACK,
                                     facecolor=(*_rgb(colour), _FILL_ALPHA))
                box.set_gid(f"{pairing} channel {c}")
                ax.add_patch(box)
                ax.text(x0 + c, y + 0.25, str(c), ha="center", va="center",
                        fontsize=VALUE_SIZE)
            rad = -0.45 if b - a == 1 else -0.25
            arc = FancyArrowPatch((x0 + a, y + 0.5), (x0 + b, y + 0.5), arrowstyle="-",
                                  connectionstyle=f"arc3,rad={rad}", lw=1.4, color=colour,
                                  shrinkA=0, shrinkB=0)
            arc.set_gid(f"{pairing} pair {i}")
            ax.add_patch(arc)
    ax.text(x0 + (head_dim - 1) / 2, -0.05, "channels of one head; a pair turns by one angle",
            ha="center", va="top", fontsize=VALUE_SIZE, color=GREY)
    ax.set_xlim(0, x0 + head_dim - 0.3)
    ax.set_ylim(-0.45, 2.6)
    ax.axis("off")
    return fig, ax
