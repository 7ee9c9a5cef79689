"""The house look shared by every figure and every explorer frame: one column width, one set
of font sizes, one line palette, the colour maps and the mask colours.

A new figure is at most ``MAX_WIDTH`` inches wide: at ``DPI`` (matplotlib's inline 100 dpi)
it fits the book's ~750 px content column unscaled, so its 9-10 pt text stays 12-14 px on
screen. ``WEIGHT_CMAP`` draws values in [0, 1] and ``SIGNED_CMAP`` signed values; both stay
readable with the common colour-vision deficiencies (no red-green scale anywhere). Lines take
``RUN_COLOURS`` (Okabe-Ito) in turn.
"""
from __future__ import annotations

from typing import Sequence, Union

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure

ArrayLike = Union[torch.Tensor, np.ndarray, Sequence[float]]

# Sizes ------------------------------------------------------------------------------------

DPI = 100  # pixels per inch the sizes assume: one pixel per CSS pixel, as inline figures
MAX_WIDTH = 7.5  # inches: the widest new figure, the book's content column at DPI
TITLE_SIZE = 12  # titles (and the titles and labels inside explorer frames)
LABEL_SIZE = 10  # axis labels and legends
TICK_SIZE = 10  # tick labels, colour bars included
VALUE_SIZE = 9  # numbers and notes written inside the plot

# Colours ----------------------------------------------------------------------------------

WEIGHT_CMAP = "viridis"  # attention weights and other values in [0, 1]
SIGNED_CMAP = "RdBu_r"  # signed values, centred on 0 (blue < 0 < red)

# The line colours of every plot, in the order the lines take them: blue, orange, reddish
# purple, sky blue, black, vermillion (Okabe-Ito), told apart with the common colour-vision
# deficiencies, and no red-green pair; vermillion, the nearest to orange, comes last.
RUN_COLOURS = ("#0072B2", "#E69F00", "#CC79A7", "#56B4E9", "#000000", "#D55E00")
BLUE, ORANGE, PURPLE, SKY_BLUE, BLACK, VERMILLION = RUN_COLOURS
CURVE_STYLES = ("-", "--", "-.", ":", "-")
CURVE_COLOURS = RUN_COLOURS[:len(CURVE_STYLES)]  # one colour per line style
GREY = "#7f7f7f"  # reference lines and bands drawn behind the measurements

# Colours of a KV-cache mask: a visible key in viridis's dark blue, a blocked one pale grey
# (told apart by lightness alone, so in any colour vision and in greyscale).
MASK_VISIBLE = "#31688e"
MASK_BLOCKED = "#eeeeee"


# Helpers of the figure functions ----------------------------------------------------------


def to_numpy(x: ArrayLike) -> np.ndarray:
    """Return `x` as a float numpy array (tensors are detached and moved to the CPU)."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        if x.dtype in (torch.float16, torch.bfloat16):
            x = x.float()  # numpy has no bfloat16
        x = x.numpy()
    return np.asarray(x, dtype=float)


def new_axes(ax: Axes | None, figsize: tuple[float, float]) -> tuple[Figure, Axes]:
    """Return `(fig, ax)`: a new figure of size `figsize` when `ax` is None, else `ax`'s figure.

    A figure wider than ``MAX_WIDTH`` is scaled down to that width, keeping its proportions."""
    if ax is None:
        width, height = figsize
        if width > MAX_WIDTH:
            width, height = MAX_WIDTH, height * MAX_WIDTH / width
        fig, ax = plt.subplots(figsize=(width, height), layout="constrained")
    else:
        fig = ax.figure
    return fig, ax


def label_axes(ax: Axes, title: str | None, xlabel: str, ylabel: str) -> None:
    """Apply the house title, axis-label and tick-label sizes."""
    if title is not None:
        ax.set_title(title, fontsize=TITLE_SIZE)
    ax.set_xlabel(xlabel, fontsize=LABEL_SIZE)
    ax.set_ylabel(ylabel, fontsize=LABEL_SIZE)
    ax.tick_params(labelsize=TICK_SIZE)
