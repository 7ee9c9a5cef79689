"""FlashAttention's tiling, drawn: the score matrix cut into tiles of queries by keys, which
tiles a causal mask skips, the tile being computed with the pieces it needs in on-chip SRAM,
and the order in which the two loops visit the tiles (FlashAttention-1: key/value tiles outer;
FlashAttention-2: query tiles outer).

Tiles are matplotlib patches, so the figure renders the same in the book (SVG), in Jupyter and
in Colab. Kinds of tile differ by fill *and* hatching, so no colour has to be told apart.
"""
from __future__ import annotations

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Rectangle

from transformer_lib.plotting.style import (
    BLACK,
    BLUE,
    GREY,
    LABEL_SIZE,
    ORANGE,
    TITLE_SIZE,
    VALUE_SIZE,
    new_axes,
)

LOOP_ORDERS = ("fa1", "fa2")  #: the loop orders of flash_tiling: FlashAttention 1 and 2
_SRAM = ORANGE  # the pieces in on-chip memory for the current tile
_COMPUTED = (*[c / 255 for c in (86, 180, 233)], 0.35)  # sky blue, light: computed tiles
_STRIP = 0.55  # width of the Q and O strips and the height of the K strip (data units)


def _tile(ax: Axes, x: float, y: float, w: float, h: float, gid: str, *, face, hatch=None,
          edge=BLACK, lw: float = 0.8) -> None:
    patch = Rectangle((x, y), w, h, facecolor=face, edgecolor=edge, lw=lw, hatch=hatch)
    patch.set_gid(gid)
    ax.add_patch(patch)


def _arrow(ax: Axes, start: tuple[float, float], end: tuple[float, float], gid: str,
           colour: str = BLUE) -> None:
    arrow = FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=12, lw=1.8,
                            color=colour, shrinkA=0, shrinkB=0)
    arrow.set_gid(gid)
    ax.add_patch(arrow)


def flash_tiling(n_q: int = 4, n_k: int = 4, *, order: str = "fa2", causal: bool = True,
                 current: tuple[int, int] = (2, 1), ax: Axes | None = None,
                 title: str | None = None) -> tuple[Figure, Axes]:
    """The ``(T, S)`` score matrix as ``n_q`` query tiles by ``n_k`` key/value tiles.

    Left, the query tiles Q_i; on top, the key tiles K_j (V_j is read with them); right, the
    output tiles O_i. Computed tiles are light blue; with ``causal``, tiles above the
    diagonal are skipped (white) and diagonal tiles are masked inside (hatched). The current
    tile (i, j) and what it needs in SRAM (Q_i, K_j, V_j, and the running O_i, m_i, l_i) are
    orange. A blue arrow shows the inner loop, a grey one the outer loop: ``"fa1"`` walks down
    a column of key/value tile j (rewriting each O_i, m_i, l_i in HBM once per j), ``"fa2"``
    along a row of query tile i (O_i written once, when the row ends).

    Args:
        n_q, n_k: query tiles and key/value tiles (2 to 8 each; square when causal).
        order: ``"fa1"`` or ``"fa2"``, the loop order drawn.
        causal: skip the tiles above the diagonal (needs ``n_q == n_k``).
        current: (i, j), the tile being computed; a computed tile.
        ax: Axes to draw on; a new 2.7 x 3.0 inch figure is created when None.
        title: the title; by default the loop order in words.

    Returns:
        (fig, ax). Tile patches have gids ``"S i,j"`` (scores), ``"Q i"``, ``"K j"``,
        ``"O i"``; the arrows ``"inner loop"`` and ``"outer loop"``.
    """
    if order not in LOOP_ORDERS:
        raise ValueError(f"order must be one of {LOOP_ORDERS}, got {order!r}")
    if not (2 <= n_q <= 8 and 2 <= n_k <= 8):
        raise ValueError(f"n_q ({n_q}) and n_k ({n_k}) must be in 2 ... 8")
    if causal and n_q != n_k:
        raise ValueError(f"a causal tiling is drawn square: n_q ({n_q}) must equal n_k ({n_k})")
    i_now, j_now = current
    if not (0 <= i_now < n_q and 0 <= j_now < n_k) or (causal and j_now > i_now):
        raise ValueError(f"current {current} must be a computed tile of the {n_q} x {n_k} grid")
    fig, ax = new_axes(ax, figsize=(2.7, 3.0))
    x0, y0 = _STRIP + 0.25, 0.0  # the grid's top-left corner; rows go down (y decreases)
    for i in range(n_q):
        for j in range(n_k):
            x, y = x0 + j, y0 - i - 1
            if (i, j) == (i_now, j_now):
                _tile(ax, x, y, 1, 1, f"S {i},{j}", face=_SRAM, lw=2.0)
            elif causal and j > i:
                _tile(ax, x, y, 1, 1, f"S {i},{j}", face="white", edge=GREY)
            else:
                _tile(ax, x, y, 1, 1, f"S {i},{j}", face=_COMPUTED,
                      hatch="///" if causal and i == j else None)
        _tile(ax, 0.0, y0 - i - 1, _STRIP, 1, f"Q {i}",
              face=_SRAM if i == i_now else "white")
        _tile(ax, x0 + n_k + 0.25, y0 - i - 1, _STRIP, 1, f"O {i}",
              face=_SRAM if i == i_now else "white")
    for j in range(n_k):
        _tile(ax, x0 + j, 0.25, 1, _STRIP, f"K {j}", face=_SRAM if j == j_now else "white")
    ax.text(_STRIP / 2, y0 - n_q - 0.1, "Q", ha="center", va="top", fontsize=LABEL_SIZE)
    ax.text(x0 + n_k + 0.25 + _STRIP / 2, y0 - n_q - 0.1, "O", ha="center", va="top",
            fontsize=LABEL_SIZE)
    ax.text(x0 - 0.1, 0.25 + _STRIP / 2, "K, V", ha="right", va="center",
            fontsize=VALUE_SIZE)
    if order == "fa2":  # inner: along row i; outer: down the rows
        y = y0 - i_now - 0.5
        _arrow(ax, (x0 + 0.15, y), (x0 + n_k - 0.15, y) if not causal else
               (x0 + i_now + 0.85, y), "inner loop")
        _arrow(ax, (x0 + n_k + 0.25 + _STRIP + 0.2, y0 - 0.2),
               (x0 + n_k + 0.25 + _STRIP + 0.2, y0 - n_q + 0.2), "outer loop", GREY)
        caption = "queries outer: $O_i$ and $\\mathrm{lse}_i$\nwritten to HBM once"
    else:  # inner: down column j; outer: across the columns
        x = x0 + j_now + 0.5
        _arrow(ax, (x, y0 - (j_now if causal else 0) - 0.15), (x, y0 - n_q + 0.15),
               "inner loop")
        _arrow(ax, (x0 + 0.2, y0 - n_q - 0.25), (x0 + n_k - 0.2, y0 - n_q - 0.25),
               "outer loop", GREY)
        caption = "K/V outer: $O_i$, $m_i$, $\\ell_i$ read\nand rewritten per K/V tile"
    ax.text(x0 + n_k / 2, y0 - n_q - 0.45, caption + "\norange: in SRAM now", ha="center",
            va="top", fontsize=VALUE_SIZE)
    if title is None:
        title = "FlashAttention-2" if order == "fa2" else "FlashAttention-1"
    ax.set_title(title, fontsize=TITLE_SIZE)
    ax.set_xlim(-0.1, x0 + n_k + 0.25 + _STRIP + 0.45)
    ax.set_ylim(y0 - n_q - 1.75, 0.25 + _STRIP + 0.1)
    ax.set_aspect("equal")
    ax.axis("off")
    return fig, ax
