"""Attention figures: a heatmap of weights, the same map as text, and the KV-cache mask.

Each figure function takes ``ax=None`` (draw on a new figure) or an existing Axes and returns
``(fig, ax)``; inputs may be torch tensors or numpy arrays (see :mod:`.style` for the look).
"""
from __future__ import annotations

from typing import Sequence

import matplotlib
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from transformer_lib.plotting.style import (
    LABEL_SIZE,
    MASK_BLOCKED,
    MASK_VISIBLE,
    TICK_SIZE,
    TITLE_SIZE,
    VALUE_SIZE,
    WEIGHT_CMAP,
    ArrayLike,
    label_axes,
    new_axes,
    to_numpy,
)

TEXT_RAMP = " .:-=+*#%@"  #: attention_text: weight 0 -> " ", weight >= 0.9 -> "@"


def _check_attention(weights: ArrayLike, x_labels, y_labels) -> np.ndarray:
    """Return `weights` as a `(T, S)` array after checking its shape against the labels."""
    w = to_numpy(weights)
    if w.ndim != 2:
        raise ValueError(f"weights must be 2-D (T, S), got shape {tuple(w.shape)}")
    T, S = w.shape
    if x_labels is not None and len(x_labels) != S:
        raise ValueError(f"x_labels has {len(x_labels)} entries but weights has {S} columns")
    if y_labels is not None and len(y_labels) != T:
        raise ValueError(f"y_labels has {len(y_labels)} entries but weights has {T} rows")
    return w


def attention_heatmap(
    weights: ArrayLike,
    x_labels: Sequence | None = None,
    y_labels: Sequence | None = None,
    *,
    ax: Axes | None = None,
    title: str | None = None,
    show_values: bool = False,
    reference: ArrayLike | None = None,
    colorbar: bool = True,
) -> tuple[Figure, Axes]:
    """Draw an attention map: one row per query, one column per key, colour range [0, 1].

    Args:
        weights: attention weights, shape (T, S); rows are queries, columns are keys.
        x_labels: S key (source) token labels for the x ticks.
        y_labels: T query token labels for the y ticks.
        ax: Axes to draw on; a new figure is created when None.
        title: figure title.
        show_values: write each weight, to two decimals, inside its cell.
        reference: boolean or 0/1 array, shape (T, S); its True cells are outlined in red
            (e.g. the mirrored diagonal a sequence-reversal model should learn).
        colorbar: draw the colour bar (leave it out of all but one panel of a row of maps:
            they share the range [0, 1]).

    Returns:
        (fig, ax).
    """
    w = _check_attention(weights, x_labels, y_labels)
    T, S = w.shape
    fig, ax = new_axes(ax, figsize=(1.0 + 0.45 * S, 0.6 + 0.45 * T))
    image = ax.imshow(w, cmap=WEIGHT_CMAP, vmin=0.0, vmax=1.0,
                      interpolation="none")  # one pixel per cell: sharp in an SVG
    if colorbar:
        fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04).ax.tick_params(labelsize=TICK_SIZE)
    if x_labels is not None:
        labels = [str(label) for label in x_labels]
        ax.set_xticks(range(S), labels=labels, rotation=90 if max(map(len, labels)) > 2 else 0)
    if y_labels is not None:
        ax.set_yticks(range(T), labels=[str(label) for label in y_labels])
    if show_values:
        for i in range(T):
            for j in range(S):
                colour = "white" if w[i, j] < 0.5 else "black"  # readable on viridis
                ax.text(j, i, f"{w[i, j]:.2f}", ha="center", va="center",
                        fontsize=VALUE_SIZE, color=colour)
    if reference is not None:
        ref = to_numpy(reference)
        if ref.shape != w.shape:
            raise ValueError(f"reference has shape {tuple(ref.shape)} but weights has shape "
                             f"{(T, S)}")
        for i, j in zip(*np.nonzero(ref)):
            ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red",
                                   linewidth=2))
    label_axes(ax, title, "key (source)", "query")
    return fig, ax


def attention_text(
    weights: ArrayLike,
    x_labels: Sequence | None = None,
    y_labels: Sequence | None = None,
    *,
    key_name: str = "key",
    query_name: str = "query",
) -> str:
    """Render an attention map as text; denser characters mean larger weights.

    Each weight w in [0, 1] becomes ``TEXT_RAMP[min(int(10 * w), 9)]``: 0 is a space,
    0.5 is "+", 0.9 and above is "@". Columns are 3 characters wide (key labels are cut
    to 3 characters); row labels are right-aligned; trailing spaces are removed.

    Args:
        weights: attention weights, shape (T, S); rows are queries, columns are keys.
        x_labels: S key labels for the header row (default 0..S-1).
        y_labels: T query labels for the rows (default 0..T-1).
        key_name: caption for the header row, e.g. "source (encoder)".
        query_name: caption for the rows, e.g. "decoder step".

    Returns:
        The rendering: a header row, T rows, a caption row and a legend row, joined by newlines.
    """
    w = _check_attention(weights, x_labels, y_labels)
    T, S = w.shape
    keys = [str(label)[:3] for label in (x_labels if x_labels is not None else range(S))]
    queries = [str(label) for label in (y_labels if y_labels is not None else range(T))]
    width = max(len(label) for label in queries + ["^"])
    levels = np.minimum((np.clip(w, 0.0, 1.0) * len(TEXT_RAMP)).astype(int), len(TEXT_RAMP) - 1)

    lines = [" " * (width + 1) + "".join(f"{label:>3}" for label in keys) + f"   <- {key_name}"]
    for label, row in zip(queries, levels):
        cells = "".join(f"{TEXT_RAMP[level]:>3}" for level in row)
        lines.append(f"{label:>{width}} {cells}".rstrip())
    lines.append(f"{'^':>{width}} {query_name}")
    lines.append(f"scale: '{TEXT_RAMP}' = weight 0 ... 1")
    return "\n".join(lines)


ABOVE_PAD = 3  #: points between the top of a mask and the "cached" / "new" captions


def _above(ax: Axes, x: float, text: str) -> None:
    """Write `text` centred on data column `x`, just above the Axes (a fixed gap in points)."""
    ax.annotate(text, xy=(x, 1.0), xycoords=("data", "axes fraction"), xytext=(0, ABOVE_PAD),
                textcoords="offset points", ha="center", va="bottom", fontsize=VALUE_SIZE)


def kv_cache_mask(
    mask: ArrayLike,
    cached: int,
    *,
    rope_rows: Sequence[int] | None = None,
    ax: Axes | None = None,
    title: str | None = None,
) -> tuple[Figure, Axes]:
    """Draw which new query may see which key when ``cached`` positions are already in a
    KV cache: one row per new query, one column per key, visible keys dark.

    The T queries sit at absolute positions ``cached … cached + T - 1`` (the left tick
    labels); keys run ``0 … S - 1`` with ``S = cached + T``. A vertical line separates the
    cached keys from the keys of the new tokens. The right-hand labels give the row of the
    RoPE tables each query is turned by (by default its own position).

    Args:
        mask: boolean or 0/1 array, shape (T, S); True (1) = may attend.
        cached: the number of positions already cached, ``S - T``.
        rope_rows: the RoPE row of each of the T queries (default ``cached … cached+T-1``);
            pass other rows to draw a bug, e.g. ``range(T)``.
        ax: Axes to draw on; a new figure is created when None.
        title: figure title.

    Returns:
        (fig, ax). The image is ``ax.images[0]``; the line between cached and new keys is
        ``ax.lines[0]`` (only when ``cached > 0``).
    """
    m = to_numpy(mask)
    if m.ndim != 2:
        raise ValueError(f"mask must be 2-D (T, S), got shape {tuple(m.shape)}")
    T, S = m.shape
    if cached < 0 or cached + T != S:
        raise ValueError(f"a mask of shape {(T, S)} needs cached = S - T = {S - T}, "
                         f"got cached = {cached}")
    rows = list(range(cached, cached + T)) if rope_rows is None else [int(r) for r in rope_rows]
    if len(rows) != T:
        raise ValueError(f"rope_rows has {len(rows)} entries but the mask has {T} rows")
    fig, ax = new_axes(ax, figsize=(1.6 + 0.42 * S, 1.3 + 0.42 * T))
    cmap = matplotlib.colors.ListedColormap([MASK_BLOCKED, MASK_VISIBLE])
    ax.imshow(m, cmap=cmap, vmin=0.0, vmax=1.0, interpolation="none")
    ax.set_xticks(range(S), labels=[str(j) for j in range(S)])
    ax.set_yticks(range(T), labels=[str(cached + i) for i in range(T)])
    ax.set_xticks(np.arange(-0.5, S), minor=True)
    ax.set_yticks(np.arange(-0.5, T), minor=True)
    ax.grid(which="minor", color="white", linewidth=1.5)
    ax.tick_params(which="minor", length=0)
    if cached > 0:
        ax.axvline(cached - 0.5, color="black", linewidth=2.5)
        _above(ax, (cached - 1) / 2, "cached")
    _above(ax, cached + (T - 1) / 2, "new")
    right = ax.secondary_yaxis("right")
    right.set_yticks(range(T), labels=[str(r) for r in rows])
    right.tick_params(labelsize=TICK_SIZE)
    right.set_ylabel("RoPE row", fontsize=LABEL_SIZE)
    label_axes(ax, title, "key position", "query position")
    if title is not None:
        ax.set_title(title, fontsize=TITLE_SIZE, pad=ABOVE_PAD + 1.6 * VALUE_SIZE)  # over them
    return fig, ax
