"""The house look shared by every figure and every explorer frame: one set of widths, one set
of font sizes, one line palette, the colour maps and the mask colours, and the format figures
are shown in.

Figures are shown as SVG (:func:`use_book_style`, which each chapter calls in its imports
cell): lines and text stay sharp at any screen density and zoom, and a heatmap's cells
are embedded once, one pixel per cell, and drawn as sharp squares. An SVG is shown at
``CSS_PX_PER_INCH`` (96) CSS pixels per inch, and a point of text is 4/3 of a CSS pixel.

A new figure is at most ``FIGURE_WIDTH`` inches wide, so that on a 390 px phone, whose
content column is ``PHONE_COLUMN`` CSS pixels, it shrinks by at most 350 / (96 x 5.4) = 0.675
and its smallest text, 10 pt (13.3 px at full size), stays ``PHONE_TEXT_PX`` (9) CSS pixels or
more: :func:`phone_text_px` gives the size. ``MAX_WIDTH`` is the content column at 1366 px
(explorer frames are drawn that wide, as PNG, at ``DPI``). ``WEIGHT_CMAP`` draws values in
[0, 1] and ``SIGNED_CMAP`` signed values; both stay readable with the common colour-vision
deficiencies (no red-green scale anywhere). Lines take ``RUN_COLOURS`` (Okabe-Ito) in turn.
"""
from __future__ import annotations

from typing import Sequence, Union

import matplotlib.pyplot as plt
import numpy as np
import torch
from cycler import cycler
from matplotlib.axes import Axes
from matplotlib.axis import Axis
from matplotlib.figure import Figure
from matplotlib.ticker import LogFormatterSciNotation

#: What a figure accepts as data: a torch tensor, a numpy array or a sequence of numbers.
ArrayLike = Union[torch.Tensor, np.ndarray, Sequence[float]]

# Sizes ------------------------------------------------------------------------------------

DPI = 100  #: pixels per inch of explorer frames (PNG, one pixel per CSS pixel)
MAX_WIDTH = 7.5  #: inches: the book's content column at DPI, the widest explorer frame
CSS_PX_PER_INCH = 96  #: CSS pixels per inch of an SVG figure (1 pt = 96 / 72 CSS px)
PHONE_COLUMN = 358  #: CSS pixels: the content column on a 390 px phone (measured)
PHONE_TEXT_PX = 9  #: CSS pixels: the smallest text a figure may show on that phone
#: inches: the widest new figure (518 CSS px), whose 10 pt text stays
#: >= PHONE_TEXT_PX on the phone
FIGURE_WIDTH = 5.4
SVG_PAD = 0.05  #: inches of margin the shown SVG keeps around the drawing, on each side
FIGURE_FORMAT = "svg"  #: the format figures are shown in by IPython (Jupyter, Colab, the book)
TITLE_SIZE = 12  #: titles (and the titles and labels inside explorer frames)
LABEL_SIZE = 10  #: axis labels and legends
TICK_SIZE = 10  #: tick labels, colour bars included
VALUE_SIZE = 10  #: numbers and notes written inside the plot

# Colours ----------------------------------------------------------------------------------

WEIGHT_CMAP = "viridis"  #: attention weights and other values in [0, 1]
SIGNED_CMAP = "RdBu_r"  #: signed values, centred on 0 (blue < 0 < red)

#: The line colours of every plot, in the order the lines take them: blue, orange, reddish
#: purple, sky blue, black, vermillion (Okabe-Ito), told apart with the common colour-vision
#: deficiencies, and no red-green pair; vermillion, the nearest to orange, comes last.
RUN_COLOURS = ("#0072B2", "#E69F00", "#CC79A7", "#56B4E9", "#000000", "#D55E00")
BLUE, ORANGE, PURPLE, SKY_BLUE, BLACK, VERMILLION = RUN_COLOURS
CURVE_STYLES = ("-", "--", "-.", ":", "-")  #: line styles, one per curve of a figure
CURVE_COLOURS = RUN_COLOURS[:len(CURVE_STYLES)]  #: one colour per line style
GREY = "#7f7f7f"  #: reference lines and bands drawn behind the measurements

#: Colours of a KV-cache mask: a visible key in viridis's dark blue, a blocked one pale grey
#: (told apart by lightness alone, so in any colour vision and in greyscale).
MASK_VISIBLE = "#31688e"
MASK_BLOCKED = "#eeeeee"  #: a blocked key of a KV-cache mask (see ``MASK_VISIBLE``)


# Helpers of the figure functions ----------------------------------------------------------


def to_numpy(x: ArrayLike) -> np.ndarray:
    """Return `x` as a float numpy array (tensors are detached and moved to the CPU)."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        if x.dtype in (torch.float16, torch.bfloat16):
            x = x.float()  # numpy has no bfloat16
        x = x.numpy()
    return np.asarray(x, dtype=float)


def phone_text_px(size_pt: float, width_in: float) -> float:
    """Return the height in CSS pixels of `size_pt`-point text in an SVG figure `width_in`
    inches wide, shown on a 390 px phone (the figure, with its ``SVG_PAD`` margins, shrinks
    to fit ``PHONE_COLUMN``).

    Args:
        size_pt: font size in points.
        width_in: figure width in inches.

    Returns:
        The text's size in CSS pixels on the phone, e.g. 9.04 for 10 pt at 5.4 in.
    """
    if size_pt <= 0 or width_in <= 0:
        raise ValueError(f"size_pt ({size_pt}) and width_in ({width_in}) must be positive")
    full_px = (width_in + 2 * SVG_PAD) * CSS_PX_PER_INCH  # the SVG's width at full size
    return size_pt * CSS_PX_PER_INCH / 72 * min(1.0, PHONE_COLUMN / full_px)


def book_rc() -> dict[str, object]:
    """Return the matplotlib settings of the house look (see :func:`use_book_style`)."""
    return {
        "figure.figsize": (FIGURE_WIDTH, 3.4),  # a figure made without a size fits the phone
        "font.size": LABEL_SIZE,
        "axes.titlesize": TITLE_SIZE,
        "axes.labelsize": LABEL_SIZE,
        "xtick.labelsize": TICK_SIZE,
        "ytick.labelsize": TICK_SIZE,
        "legend.fontsize": LABEL_SIZE,
        "figure.titlesize": TITLE_SIZE,
        "axes.prop_cycle": cycler(color=RUN_COLOURS),  # lines drawn without a colour
        "svg.fonttype": "path",  # glyphs as outlines: the same letters without the fonts
        "svg.hashsalt": "transformer_lib",  # the same ids in every run: stable SVG files
    }


def use_book_style(shell: object | None = None) -> bool:
    """Apply the house look: set :func:`book_rc` and, in IPython, show figures as SVG.

    Importing :mod:`transformer_lib.plotting` changes no global state: a notebook calls this
    once, in its imports cell (every chapter does, so the book's build, Jupyter, Colab and
    nbval show the same figures). It changes matplotlib's ``rcParams`` and, in IPython, the
    shell's display formatters and the inline backend's configuration, so that the backend,
    when it is activated later (at the first figure), keeps the format.

    Args:
        shell: the IPython shell to configure; by default the running one, if any.

    Returns:
        True when an IPython shell was set to show figures as ``FIGURE_FORMAT``.
    """
    plt.rcParams.update(book_rc())
    if shell is None:
        try:
            from IPython import get_ipython
        except ImportError:  # plain Python: nothing to display figures
            return False
        shell = get_ipython()
    if shell is None:
        return False
    try:
        from IPython.core.pylabtools import select_figure_formats
        from matplotlib_inline.config import InlineBackend
    except ImportError:
        return False
    backend = InlineBackend.instance(parent=shell)  # the one the kernel uses, made now or then
    backend.print_figure_kwargs = {**backend.print_figure_kwargs, "pad_inches": SVG_PAD}
    backend.figure_formats = {FIGURE_FORMAT}  # what the backend selects when activated
    select_figure_formats(shell, {FIGURE_FORMAT}, **backend.print_figure_kwargs)
    return True


def new_axes(ax: Axes | None, figsize: tuple[float, float]) -> tuple[Figure, Axes]:
    """Return `(fig, ax)`: a new figure of size `figsize` when `ax` is None, else `ax`'s figure.

    A figure wider than ``FIGURE_WIDTH`` is scaled down to that width, keeping its
    proportions."""
    if ax is None:
        width, height = figsize
        if width > FIGURE_WIDTH:
            width, height = FIGURE_WIDTH, height * FIGURE_WIDTH / width
        fig, ax = plt.subplots(figsize=(width, height), layout="constrained")
    else:
        fig = ax.figure
    return fig, ax


class _PlainLogFormatter(LogFormatterSciNotation):
    """Label the ticks matplotlib would label on a log axis, as plain numbers (0.2, 1, 40)."""

    def __call__(self, x: float, pos: int | None = None) -> str:
        return f"{x:g}" if super().__call__(x, pos) else ""


def plain_log_ticks(axis: Axis) -> None:
    """Write the tick labels of the log-scaled `axis` as plain numbers (0.2, 0.3, 1, 2) rather
    than powers (2 x 10^-1), major and minor ticks alike."""
    axis.set_major_formatter(_PlainLogFormatter())
    axis.set_minor_formatter(_PlainLogFormatter(labelOnlyBase=False))


def label_axes(ax: Axes, title: str | None, xlabel: str, ylabel: str) -> None:
    """Apply the house title, axis-label and tick-label sizes."""
    if title is not None:
        ax.set_title(title, fontsize=TITLE_SIZE)
    ax.set_xlabel(xlabel, fontsize=LABEL_SIZE)
    ax.set_ylabel(ylabel, fontsize=LABEL_SIZE)
    ax.tick_params(labelsize=TICK_SIZE)
