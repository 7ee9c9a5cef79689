"""The softmax explorer (chapter 1): one row of attention scores, its softmax weights and the
softmax's largest gradient as the head width d_k grows, with and without the 1/√d_k scale.

The row is a fixed random row z (standard normal entries) given the spread that the scores
q·k of random queries and keys have at width d_k: √d_k · z unscaled, and z once divided by
√d_k. Every frame is rendered in advance, so the explorer works in the static book.
"""
from __future__ import annotations

import math
from typing import Sequence

import ipywidgets as widgets
import numpy as np
import torch
from matplotlib.artist import Artist
from matplotlib.figure import Figure
from torch import Tensor

from transformer_lib.plotting.style import BLUE, DPI, GREY, VERMILLION
from transformer_lib.widgets.frames import (
    FRAME_WIDTH,
    NARROW_FONT,
    NARROW_WIDTH,
    Explorer,
    _check_frames,
    _control_row,
    _linked_pictures,
    _picture_sets,
    _render_frames,
)

SOFTMAX_DIMS = (1, 4, 16, 64, 256, 1024)  #: the head widths d_k to choose from
SCALINGS = ("none", "÷ √d_k")  #: what the scores are divided by: 1, or √d_k
SCALING_COLOURS = (VERMILLION, BLUE)  #: one per scaling, in all three panels
#: The frames are as wide as the column and shrink to half that on a phone: larger text.
SOFTMAX_FONT = 14
SOFTMAX_FRAME = (FRAME_WIDTH, 4.8)  #: the frame's (width, height) in inches
SOFTMAX_NARROW_FRAME = (NARROW_WIDTH, 7.2)  #: inches: the three panels one above the other


class SoftmaxExplorer(Explorer):
    """The widget :func:`softmax_explorer` returns.

    Besides :class:`~transformer_lib.widgets.frames.Explorer`'s ``controls`` ``d_k`` and
    ``scale``, ``pictures`` ``{"softmax": …, "text": …}`` and ``links``, it holds:

    Attributes:
        z: the fixed random row ``(n_keys,)``; width d_k scores √d_k · z unscaled, z scaled.
        dims: the head widths of the ``d_k`` control, in order.
    """

    z: Tensor
    dims: tuple[int, ...]

    def __init__(self, children: Sequence[widgets.Widget], *, z: Tensor,
                 dims: tuple[int, ...], **parts) -> None:
        super().__init__(children, **parts)
        self.z, self.dims = z, dims


def _softmax_table(z: Tensor, dims: Sequence[int], scaled: bool
                   ) -> tuple[Tensor, Tensor, Tensor]:
    """Scores, weights and the softmax's largest gradient for each head width, in float64.

    Args:
        z: the row ``(S,)``, standard normal entries.
        dims: head widths d_k; the raw scores at width d are √d · z, the typical size of q·k
            there (its variance is d for q, k of unit variance).
        scaled: divide the raw scores by √d_k (giving z), else leave them.

    Returns:
        ``scores`` ``(len(dims), S)``, the softmax's inputs; ``weights`` ``(len(dims), S)``,
        its outputs; ``largest`` ``(len(dims),)``, the largest entry max |∂p_i/∂s_j| of the
        Jacobian ``diag(p) − p pᵀ`` of the weights p with respect to those scores s.
    """
    z64 = z.double()
    scores = torch.stack([z64 * (1.0 if scaled else math.sqrt(d))
                          for d in dims])  # (n, S): one row per width
    weights = torch.softmax(scores, dim=-1)  # (n, S)
    jacobian = torch.diag_embed(weights) - weights[:, :, None] * weights[:, None, :]  # (n, S, S)
    return scores, weights, jacobian.abs().amax(dim=(-2, -1))


def _softmax_frames(z: Tensor, dims: Sequence[int], scaled: bool,
                    narrow: bool = False) -> list[bytes]:
    """Frames j = 0 … len(dims)-1 for head width ``dims[j]``: the scores (top left), their
    softmax (bottom left), and the largest gradient entry against d_k (right), for both
    scalings (faint) with width ``dims[j]`` under ``scaled`` marked. ``narrow``: the frames
    for a phone, the three panels one above the other."""
    n_keys = z.shape[0]
    tables = [_softmax_table(z, dims, s) for s in (False, True)]
    scores, weights, largest = tables[int(scaled)]
    colour = SCALING_COLOURS[int(scaled)]
    size = NARROW_FONT if narrow else SOFTMAX_FONT

    if narrow:
        fig = Figure(figsize=SOFTMAX_NARROW_FRAME, dpi=DPI, layout="constrained")
        ax_s, ax_p, ax_g = fig.subplots(3, 1, height_ratios=(1, 1, 1.3))
    else:
        fig = Figure(figsize=SOFTMAX_FRAME, dpi=DPI, layout="constrained")
        grid = fig.add_gridspec(2, 2, width_ratios=(1.1, 1))
        ax_s, ax_p, ax_g = (fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[1, 0]),
                            fig.add_subplot(grid[:, 1]))
    keys = np.arange(n_keys)
    top = 1.1 * float(scores.abs().max())
    ax_s.set(ylim=(-top, top), xticks=keys, xticklabels=[])
    ax_s.axhline(0, color=GREY, linewidth=0.8)
    ax_s.set_ylabel(r"score $s_j$", fontsize=size)
    ax_p.set(ylim=(0, 1.05), xticks=keys)
    ax_p.set_xlabel(r"key $j$", fontsize=size)
    ax_p.set_ylabel(r"weight $p_j$", fontsize=size)
    for s, (_, _, curve) in enumerate(tables):
        ax_g.plot(dims, curve.numpy(), color=SCALING_COLOURS[s], marker="o", markersize=4,
                  alpha=0.45, linewidth=1.5, label=SCALINGS[s])
    ax_g.axhline(0.25, color=GREY, linestyle=":", linewidth=1)  # p(1 - p) is at most 1/4
    ax_g.set(xscale="log", yscale="log", xticks=list(dims), xticklabels=[str(d) for d in dims])
    ax_g.minorticks_off()
    floor = min(float(t[2].min()) for t in tables)
    ax_g.set_ylim(floor / 10, 1.0)
    ax_g.set_xlabel(r"head width $d_k$", fontsize=size)
    legend = size - 1 if narrow else size - 2
    ax_g.legend(title="scale", fontsize=legend, title_fontsize=legend, loc="lower left")
    for ax in (ax_s, ax_p, ax_g):
        ax.tick_params(labelsize=size - 1)
        ax.set_title(" ", fontsize=size)
    bars_s = ax_s.bar(keys, np.zeros(n_keys), color=colour, animated=True)
    bars_p = ax_p.bar(keys, np.zeros(n_keys), color=colour, animated=True)
    (point,) = ax_g.plot([], [], marker="o", markersize=11, color=colour,
                         markeredgecolor="black", linestyle="none", animated=True)

    def draw(j: int) -> list[Artist]:
        d = dims[j]
        for bar, value in zip(bars_s, scores[j].tolist()):
            bar.set_height(value)
        for bar, value in zip(bars_p, weights[j].tolist()):
            bar.set_height(value)
        point.set_data([d], [float(largest[j])])
        divisor = f"÷ √{d}" if scaled else "unscaled"
        ax_s.set_title(f"$d_k$ = {d}, {divisor}: spread {float(scores[j].std()):.2f}",
                       fontsize=size)
        ax_p.set_title(f"softmax: largest weight {float(weights[j].max()):.3f}", fontsize=size)
        ax_g.set_title(rf"largest $|\partial p_i / \partial s_j|$: {float(largest[j]):.1e}",
                       fontsize=size)
        return [*bars_s, *bars_p, point, ax_s.title, ax_p.title, ax_g.title]

    return _render_frames(fig, len(dims), draw)


def _softmax_texts(z: Tensor, dims: Sequence[int], scaled: bool) -> list[str]:
    """Text frames j = 0 … len(dims)-1, the pictures' numbers in words: their text
    alternative, shown under them (HTML)."""
    scores, weights, largest = _softmax_table(z, dims, scaled)
    how = "divided by √d<sub>k</sub>" if scaled else "not scaled"
    return [f"d<sub>k</sub> = {d}, scores {how}: spread {float(scores[j].std()):.2f}, "
            f"from {float(scores[j].min()):.2f} to {float(scores[j].max()):.2f}; largest "
            f"weight {float(weights[j].max()):.3f} (key {int(weights[j].argmax())}); largest "
            f"entry of the Jacobian {float(largest[j]):.1e} (at most 0.25)."
            for j, d in enumerate(dims)]


def _check_arguments(dims: Sequence[int], n_keys: int) -> tuple[int, ...]:
    """The head widths as a tuple; a ValueError naming the bad values unless they are at
    least two increasing positive integers and ``n_keys`` >= 2."""
    dims = tuple(int(d) if isinstance(d, np.integer) else d for d in dims)
    if (len(dims) < 2 or not all(isinstance(d, (int, np.integer)) and d >= 1 for d in dims)
            or any(a >= b for a, b in zip(dims, dims[1:]))):
        raise ValueError(f"dims must be two or more increasing positive integers, got {dims}")
    if n_keys < 2:
        raise ValueError(f"n_keys must be >= 2, got {n_keys}")
    _check_frames("softmax_explorer", {"scalings": len(SCALINGS), "widths": len(dims)})
    return dims


def _softmax_caption() -> widgets.HTML:
    """What the picture shows and what to try."""
    return widgets.HTML(
        "<b>Scores, softmax and its gradient as the head width d<sub>k</sub> grows.</b> Top "
        "left: a fixed random row z times √d<sub>k</sub>, the typical size of q·k at width "
        "d<sub>k</sub> (scale <i>none</i>), or that divided by √d<sub>k</sub>, z itself "
        "(scale <i>÷ √d<sub>k</sub></i>); bottom left: their softmax; right: the "
        "largest entry of the softmax's Jacobian diag(p) − pp<sup>T</sup> against "
        "d<sub>k</sub>, for both scales (the dotted line is its largest possible value, "
        "1/4). The line under the picture gives its numbers. All pictures are precomputed.")


def softmax_explorer(*, dims: Sequence[int] = SOFTMAX_DIMS, n_keys: int = 8,
                     seed: int = 0) -> SoftmaxExplorer:
    """Explore how the head width d_k and the 1/√d_k scale saturate a softmax, with or
    without a kernel.

    Args:
        dims: the head widths d_k to choose from, increasing; at width d_k the row's raw
            scores are √d_k · z, the spread of q·k for random q, k of unit variance.
        n_keys: how many keys, hence scores, in the row.
        seed: seeds the row z (standard normal entries).

    Returns:
        A :class:`SoftmaxExplorer` (a VBox, shown as the widget) with controls ``d_k`` (a
        SelectionSlider whose ``index`` picks the width) and ``scale`` (a Dropdown over
        ``SCALINGS``: none, or ÷ √d_k) over ``2 × len(dims)`` precomputed frames
        (``pictures["softmax"]``), and under them the same frames' numbers in words, their
        text alternative (``pictures["text"]``, HTML frames).
    """
    dims = _check_arguments(dims, n_keys)
    z = torch.randn(n_keys, generator=torch.Generator().manual_seed(seed))  # (S,)

    style = {"description_width": "80px"}
    controls = {
        "d_k": widgets.SelectionSlider(options=[(str(d), d) for d in dims],
                                       description="d_k", style=style),
        # A Dropdown rather than ToggleButtons: a <select> moves with the arrow keys.
        "scale": widgets.Dropdown(options=[(name, s) for s, name in enumerate(SCALINGS)],
                                  description="scale", style=style),
    }
    order = [(controls["scale"], "index"), (controls["d_k"], "index")]
    picture, narrow, links = _picture_sets(
        lambda narrow: [_softmax_frames(z, dims, scaled, narrow)  # [scale][d]
                        for scaled in (False, True)], order)
    texts = [_softmax_texts(z, dims, scaled) for scaled in (False, True)]  # [scale][d]
    text, text_links = _linked_pictures(texts, order)
    # The picture (wide, or narrow on a phone) with its numbers in words under it.
    shown = widgets.VBox([p for p in (picture, narrow) if p is not None] + [text])
    return SoftmaxExplorer(
        [_softmax_caption(), _control_row(*controls.values()), shown],
        controls=controls, pictures={"softmax": picture, "text": text},
        narrow={"softmax": narrow}, links=links + text_links, z=z, dims=dims)
