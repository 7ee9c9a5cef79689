"""Figures of positions: a positional-encoding table, how RoPE turns one channel pair, and
curves against the position.

Each figure function takes ``ax=None`` (draw on a new figure) or an existing Axes and returns
``(fig, ax)``; inputs may be torch tensors or numpy arrays (see :mod:`.style` for the look).
"""
from __future__ import annotations

from typing import Mapping, Sequence

import matplotlib
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Circle
from matplotlib.transforms import offset_copy

from transformer_lib.plotting.style import (
    CURVE_COLOURS,
    CURVE_STYLES,
    GREY,
    SIGNED_CMAP,
    TICK_SIZE,
    VALUE_SIZE,
    WEIGHT_CMAP,
    ArrayLike,
    label_axes,
    new_axes,
    to_numpy,
)

#: points from the bottom of the plot to a legend under it: below the ticks,
#: their labels and the x label, whatever the plot's height
LEGEND_DROP = 36


def positional_heatmap(pe: ArrayLike, *, ax: Axes | None = None,
                       title: str | None = None) -> tuple[Figure, Axes]:
    """Draw a positional-encoding table with a diverging colour scale centred on 0.

    The colour range is [-1, 1] (sinusoidal encodings), widened symmetrically if any
    value lies outside it.

    Args:
        pe: positional encodings, shape (T, C): positions × channels.
        ax: Axes to draw on; a new figure is created when None.
        title: figure title.

    Returns:
        (fig, ax).
    """
    table = to_numpy(pe)
    if table.ndim != 2:
        raise ValueError(f"pe must be 2-D (positions, channels), got shape {tuple(table.shape)}")
    limit = max(1.0, float(np.abs(table).max(initial=0.0)))
    fig, ax = new_axes(ax, figsize=(5.4, 3.2))
    image = ax.imshow(table, cmap=SIGNED_CMAP, vmin=-limit, vmax=limit, aspect="auto",
                      interpolation="none")  # one pixel per value: sharp in an SVG
    fig.colorbar(image, ax=ax).ax.tick_params(labelsize=TICK_SIZE)
    label_axes(ax, title, "channel", "position")
    return fig, ax


def _rotate(v: np.ndarray, angle: float) -> np.ndarray:
    """Rotate the 2-vector `v` counter-clockwise by `angle` radians."""
    c, s = np.cos(angle), np.sin(angle)
    return np.array([c * v[0] - s * v[1], s * v[0] + c * v[1]])


def rope_rotation(
    q: ArrayLike,
    positions: Sequence[int] | ArrayLike,
    theta_i: float,
    *,
    k: ArrayLike | None = None,
    ax: Axes | None = None,
    title: str | None = None,
) -> tuple[Figure, Axes]:
    """Draw how RoPE rotates one channel pair: `q` rotated by m·theta_i for each position m.

    Each rotated query is an arrow from the origin, coloured by position and labelled with
    its angle. If `k` is given it is rotated by the same angles and drawn as black dashed
    arrows: the angle between q and k at equal positions never changes.

    The axes are named for the interleaved pairing of the RoPE paper, channels 2i and 2i+1.
    The rotation is the same in the "half" pairing of Hugging Face's Llama; there the pair
    is channels i and i + D/2 (see :mod:`transformer_lib.positional`).

    Args:
        q: one channel pair of a query, shape (2,): (channel 2i, channel 2i+1).
        positions: positions m to draw, length N.
        theta_i: rotation frequency of this channel pair, radians per position.
        k: one channel pair of a key, shape (2,), optional.
        ax: Axes to draw on; a new figure is created when None.
        title: figure title.

    Returns:
        (fig, ax). The arrows are Annotations labelled "q, m=<m>" (and "k, m=<m>").
    """
    vectors = {"q": to_numpy(q)} if k is None else {"q": to_numpy(q), "k": to_numpy(k)}
    for name, v in vectors.items():
        if v.shape != (2,):
            raise ValueError(f"{name} must have 2 entries (one channel pair), got shape "
                             f"{tuple(v.shape)}")
    positions = [int(m) for m in to_numpy(positions).reshape(-1)]
    fig, ax = new_axes(ax, figsize=(4.6, 4.6))
    colours = matplotlib.colormaps[WEIGHT_CMAP](np.linspace(0.0, 0.9, max(len(positions), 1)))

    ax.add_patch(Circle((0, 0), 1.0, fill=False, linestyle=":", color="grey"))
    ax.axhline(0, color="lightgrey", linewidth=0.8)
    ax.axvline(0, color="lightgrey", linewidth=0.8)
    for name, v in vectors.items():
        for m, colour in zip(positions, colours):
            angle = m * theta_i
            end = _rotate(v, angle)
            style = dict(arrowstyle="-|>", color=colour, linewidth=2)
            if name == "k":
                # black, not red: the q arrows run through viridis's greens
                style.update(color="black", linestyle="--", linewidth=1.2)
            arrow = ax.annotate("", xy=tuple(end), xytext=(0, 0), arrowprops=style)
            arrow.set_label(f"{name}, m={m}")
            if name == "q":
                ax.text(*(end * 1.08), f"$m$ = {m}: {angle:.2f} rad", color=colour,
                        fontsize=VALUE_SIZE, ha="left" if end[0] >= 0 else "right")
    radius = 1.35 * max([1.0] + [float(np.linalg.norm(v)) for v in vectors.values()])
    ax.set_xlim(-radius, radius)
    ax.set_ylim(-radius, radius)
    ax.set_aspect("equal")
    label_axes(ax, title, "channel $2i$", "channel $2i+1$")
    return fig, ax


def position_curves(
    curves: Mapping[str, ArrayLike],
    *,
    positions: ArrayLike | None = None,
    mark: float | None = None,
    mark_label: str | None = None,
    ax: Axes | None = None,
    title: str | None = None,
    xlabel: str = "position",
    ylabel: str = "value",
    legend_below: bool = False,
) -> tuple[Figure, Axes]:
    """Plot several named curves against the position, e.g. channels of a positional encoding
    or a model's accuracy at each position.

    Args:
        curves: name -> N values (at most ``len(CURVE_COLOURS)`` curves); each name is the
            curve's legend entry.
        positions: the N positions (default 0 … N-1).
        mark: draw a dotted vertical line at this position (e.g. the longest length seen in
            training), labelled ``mark_label`` in the legend.
        ax: Axes to draw on; a new figure is created when None.
        title, xlabel, ylabel: the figure's texts.
        legend_below: put the legend under the plot instead of inside it (for curves that
            fill the whole plot), in rows of at most two entries, so it is never wider than a
            figure of ``FIGURE_WIDTH``.

    Returns:
        (fig, ax). The curves are the first lines of ``ax``, in the order of ``curves``; the
        mark, if any, comes after them.
    """
    if not curves or len(curves) > len(CURVE_COLOURS):
        raise ValueError(f"curves must hold 1 to {len(CURVE_COLOURS)} curves, got {len(curves)}")
    values = {name: to_numpy(v).reshape(-1) for name, v in curves.items()}
    lengths = {len(v) for v in values.values()}
    n = lengths.pop() if len(lengths) == 1 else None
    if n is None or n == 0:
        sizes = ", ".join(f"{name!r}: {len(v)}" for name, v in values.items())
        raise ValueError(f"every curve needs the same, non-zero number of values, got {sizes}")
    x = np.arange(n) if positions is None else to_numpy(positions).reshape(-1)
    if len(x) != n:
        raise ValueError(f"positions has {len(x)} entries but the curves have {n} values")
    fig, ax = new_axes(ax, figsize=(5.4, 3.2))
    for (name, y), colour, style in zip(values.items(), CURVE_COLOURS, CURVE_STYLES):
        ax.plot(x, y, style, color=colour, linewidth=1.8, label=name)
    if mark is not None:
        ax.axvline(mark, color=GREY, linestyle=":", linewidth=1.5, label=mark_label)
    ax.grid(alpha=0.3)
    if legend_below:
        entries = len(values) + (mark is not None and mark_label is not None)
        under = offset_copy(ax.transAxes, fig=fig, y=-LEGEND_DROP, units="points")
        ax.legend(fontsize=VALUE_SIZE, loc="upper center", bbox_to_anchor=(0.5, 0.0),
                  bbox_transform=under, ncols=min(entries, 2), frameon=False)
    else:
        ax.legend(fontsize=VALUE_SIZE)
    label_axes(ax, title, xlabel, ylabel)
    return fig, ax
