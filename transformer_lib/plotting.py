"""Figures for the course: attention maps, positional encodings, RoPE, learning rates, losses.

Every figure function takes ``ax=None`` (draw on a new figure) or an existing Axes, and
returns ``(fig, ax)`` so a notebook can add to the picture or save it. All of them share
one look: ``WEIGHT_CMAP`` for values in [0, 1], ``SIGNED_CMAP`` for signed values (both
readable with the common colour-vision deficiencies: no red-green scale anywhere), and the
same title, label and tick sizes. A new figure is at most ``MAX_WIDTH`` inches wide: at
matplotlib's inline 100 dpi it fits the book's ~750 px content column unscaled, so its
9-10 pt text stays 12-14 px on screen. Inputs may be torch tensors or numpy arrays.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence, Union

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Circle, Rectangle

ArrayLike = Union[torch.Tensor, np.ndarray, Sequence[float]]

WEIGHT_CMAP = "viridis"  # attention weights and other values in [0, 1]
SIGNED_CMAP = "RdBu_r"  # signed values, centred on 0 (blue < 0 < red)
MAX_WIDTH = 7.5  # inches: the widest new figure, the book's content column at 100 dpi
TITLE_SIZE = 12
LABEL_SIZE = 10
TICK_SIZE = 10  # tick labels, colour bars included
VALUE_SIZE = 9  # numbers and notes written inside the plot
TEXT_RAMP = " .:-=+*#%@"  # attention_text: weight 0 -> " ", weight >= 0.9 -> "@"


def _to_numpy(x: ArrayLike) -> np.ndarray:
    """Return `x` as a float numpy array (tensors are detached and moved to the CPU)."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        if x.dtype in (torch.float16, torch.bfloat16):
            x = x.float()  # numpy has no bfloat16
        x = x.numpy()
    return np.asarray(x, dtype=float)


def _new_axes(ax: Axes | None, figsize: tuple[float, float]) -> tuple[Figure, Axes]:
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


def _label(ax: Axes, title: str | None, xlabel: str, ylabel: str) -> None:
    """Apply the house title, axis-label and tick-label sizes."""
    if title is not None:
        ax.set_title(title, fontsize=TITLE_SIZE)
    ax.set_xlabel(xlabel, fontsize=LABEL_SIZE)
    ax.set_ylabel(ylabel, fontsize=LABEL_SIZE)
    ax.tick_params(labelsize=TICK_SIZE)


def _check_attention(weights: ArrayLike, x_labels, y_labels) -> np.ndarray:
    """Return `weights` as a `(T, S)` array after checking its shape against the labels."""
    w = _to_numpy(weights)
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
    fig, ax = _new_axes(ax, figsize=(1.0 + 0.45 * S, 0.6 + 0.45 * T))
    image = ax.imshow(w, cmap=WEIGHT_CMAP, vmin=0.0, vmax=1.0)
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
        ref = _to_numpy(reference)
        if ref.shape != w.shape:
            raise ValueError(f"reference has shape {tuple(ref.shape)} but weights has shape {(T, S)}")
        for i, j in zip(*np.nonzero(ref)):
            ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=2))
    _label(ax, title, "key (source)", "query")
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


def positional_heatmap(pe: ArrayLike, *, ax: Axes | None = None, title: str | None = None) -> tuple[Figure, Axes]:
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
    table = _to_numpy(pe)
    if table.ndim != 2:
        raise ValueError(f"pe must be 2-D (positions, channels), got shape {tuple(table.shape)}")
    limit = max(1.0, float(np.abs(table).max(initial=0.0)))
    fig, ax = _new_axes(ax, figsize=(7, 4))
    image = ax.imshow(table, cmap=SIGNED_CMAP, vmin=-limit, vmax=limit, aspect="auto")
    fig.colorbar(image, ax=ax).ax.tick_params(labelsize=TICK_SIZE)
    _label(ax, title, "channel", "position")
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
    vectors = {"q": _to_numpy(q)} if k is None else {"q": _to_numpy(q), "k": _to_numpy(k)}
    for name, v in vectors.items():
        if v.shape != (2,):
            raise ValueError(f"{name} must have 2 entries (one channel pair), got shape {tuple(v.shape)}")
    positions = [int(m) for m in _to_numpy(positions).reshape(-1)]
    fig, ax = _new_axes(ax, figsize=(5, 5))
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
                ax.text(*(end * 1.08), f"m={m}: {angle:.2f} rad", color=colour, fontsize=VALUE_SIZE,
                        ha="left" if end[0] >= 0 else "right")
    radius = 1.35 * max([1.0] + [float(np.linalg.norm(v)) for v in vectors.values()])
    ax.set_xlim(-radius, radius)
    ax.set_ylim(-radius, radius)
    ax.set_aspect("equal")
    _label(ax, title, "channel 2i", "channel 2i+1")
    return fig, ax


def lr_schedule(
    lr_fn: Callable[[int], float],
    steps: int,
    *,
    ax: Axes | None = None,
    title: str | None = None,
    mark_peak: bool = True,
) -> tuple[Figure, Axes]:
    """Plot a learning-rate schedule `lr_fn(step)` for step = 0 .. steps-1.

    Args:
        lr_fn: maps a step (int) to a learning rate, e.g. a Noam lambda. It is called at
            step 0, as torch's LambdaLR does.
        steps: number of steps to plot.
        ax: Axes to draw on; a new figure is created when None.
        title: figure title.
        mark_peak: mark the largest learning rate and annotate it with its step.

    Returns:
        (fig, ax).
    """
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    lrs = np.array([float(lr_fn(step)) for step in range(steps)])
    fig, ax = _new_axes(ax, figsize=(6, 3.5))
    ax.plot(np.arange(steps), lrs)
    if mark_peak:
        peak = int(np.argmax(lrs))
        ax.plot([peak], [lrs[peak]], "o", color="tab:red")
        ax.annotate(f"peak {lrs[peak]:.2e} at step {peak}", xy=(peak, lrs[peak]),
                    xytext=(10, -15), textcoords="offset points", fontsize=VALUE_SIZE)
    _label(ax, title, "step", "learning rate")
    return fig, ax


def loss_curve(
    history: Mapping[str, Sequence[float]],
    *,
    ax: Axes | None = None,
    title: str | None = None,
    log_y: bool = False,
) -> tuple[Figure, Axes]:
    """Plot a training loss curve.

    Args:
        history: {"loss": N floats} and optionally {"step": N step numbers}
            (default 0 .. N-1).
        ax: Axes to draw on; a new figure is created when None.
        title: figure title.
        log_y: use a logarithmic loss axis.

    Returns:
        (fig, ax).
    """
    if "loss" not in history:
        raise ValueError(f"history needs a 'loss' key, got keys {sorted(history)}")
    loss = _to_numpy(history["loss"])
    steps = _to_numpy(history["step"]) if "step" in history else np.arange(len(loss))
    if len(steps) != len(loss):
        raise ValueError(f"history has {len(steps)} steps but {len(loss)} loss values")
    fig, ax = _new_axes(ax, figsize=(6, 3.5))
    ax.plot(steps, loss, label="loss")
    if log_y:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    _label(ax, title, "step", "loss")
    return fig, ax


def score_variance(
    d_k: Sequence[int] | ArrayLike,
    unscaled: ArrayLike,
    scaled: ArrayLike,
    *,
    ax: Axes | None = None,
    title: str | None = None,
) -> tuple[Figure, Axes]:
    """Plot the measured variance of attention scores against the head dimension d_k.

    Two measured series, q·k and q·k/√d_k, are drawn with markers on log-log axes (base 2),
    over wide pale lines for the values the theory predicts for independent, zero-mean,
    unit-variance components: var(q·k) = d_k (red) and var(q·k/√d_k) = 1 (blue).

    Args:
        d_k: N head dimensions (positive), e.g. [4, 16, 64, 256].
        unscaled: N measured variances of q·k, one per d_k.
        scaled: N measured variances of q·k/√d_k, one per d_k.
        ax: Axes to draw on; a new figure is created when None.
        title: figure title.

    Returns:
        (fig, ax). The lines are labelled "d_k (theory)", "1 (theory)", "q·k (measured)"
        and "q·k / √d_k (measured)", in that order.
    """
    dims = _to_numpy(d_k).reshape(-1)
    raw = _to_numpy(unscaled).reshape(-1)
    norm = _to_numpy(scaled).reshape(-1)
    if len(raw) != len(dims) or len(norm) != len(dims):
        raise ValueError(
            f"d_k has {len(dims)} entries but unscaled has {len(raw)} and scaled has {len(norm)}"
        )
    if len(dims) == 0 or np.any(dims <= 0):
        raise ValueError(f"d_k must be a non-empty list of positive sizes, got {dims.tolist()}")
    fig, ax = _new_axes(ax, figsize=(6, 3.5))
    # Theory first, as wide pale bands, so that the measurements drawn on top stay visible.
    ax.plot(dims, dims, "-", color="tab:red", alpha=0.25, linewidth=6, label="d_k (theory)")
    ax.plot(dims, np.ones_like(dims), "-", color="tab:blue", alpha=0.25, linewidth=6, label="1 (theory)")
    ax.plot(dims, raw, "o:", color="tab:red", label="q·k (measured)")
    ax.plot(dims, norm, "s:", color="tab:blue", label="q·k / √d_k (measured)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=LABEL_SIZE)
    _label(ax, title, "head dimension d_k", "variance of the score")
    return fig, ax


def scaling_curve(
    sizes: Sequence[int] | ArrayLike,
    values: ArrayLike,
    *,
    power: float = 2.0,
    ax: Axes | None = None,
    title: str | None = None,
    xlabel: str = "sequence length T",
    ylabel: str = "time (s)",
    label: str = "measured (median)",
) -> tuple[Figure, Axes]:
    """Plot a measured cost against a size on log-log axes, over a reference line ∝ size^power
    through the last measurement (on log-log axes a power law is a straight line of that slope).

    Args:
        sizes: N positive sizes, e.g. sequence lengths [128, 256, ..., 2048].
        values: N positive measurements, one per size (times, bytes, ...).
        power: the exponent of the reference line (2 for attention's T²).
        ax: Axes to draw on; a new figure is created when None.
        title, xlabel, ylabel: the figure's texts.
        label: the legend entry of the measurements.

    Returns:
        (fig, ax). The lines are the reference ("∝ T^power (slope power)") and the
        measurements, in that order.
    """
    x = _to_numpy(sizes).reshape(-1).astype(float)
    y = _to_numpy(values).reshape(-1).astype(float)
    if len(x) != len(y) or len(x) == 0:
        raise ValueError(f"sizes has {len(x)} entries but values has {len(y)}; both must be "
                         "equal and non-empty")
    if np.any(x <= 0) or np.any(y <= 0):
        raise ValueError("sizes and values must be positive for log-log axes, got "
                         f"sizes {x.tolist()} and values {y.tolist()}")
    fig, ax = _new_axes(ax, figsize=(6, 3.5))
    reference = y[-1] * (x / x[-1]) ** power
    ax.plot(x, reference, "-", color="tab:gray", alpha=0.4, linewidth=6,
            label=f"∝ T^{power:g} (slope {power:g})")
    ax.plot(x, y, "o:", color="tab:blue", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=LABEL_SIZE)
    _label(ax, title, xlabel, ylabel)
    return fig, ax


# The line colours of every plot here, in the order the lines take them: blue, orange, reddish
# purple, sky blue, black, vermillion (Okabe-Ito), told apart with the common colour-vision
# deficiencies, and no red-green pair; vermillion, the nearest to orange, comes last.
RUN_COLOURS = ("#0072B2", "#E69F00", "#CC79A7", "#56B4E9", "#000000", "#D55E00")
CURVE_STYLES = ("-", "--", "-.", ":", "-")
CURVE_COLOURS = RUN_COLOURS[:len(CURVE_STYLES)]  # one colour per line style


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
        legend_below: put the legend under the plot, in one row, instead of inside it (for
            curves that fill the whole plot).

    Returns:
        (fig, ax). The curves are the first lines of ``ax``, in the order of ``curves``; the
        mark, if any, comes after them.
    """
    if not curves or len(curves) > len(CURVE_COLOURS):
        raise ValueError(f"curves must hold 1 to {len(CURVE_COLOURS)} curves, got {len(curves)}")
    values = {name: _to_numpy(v).reshape(-1) for name, v in curves.items()}
    lengths = {len(v) for v in values.values()}
    n = lengths.pop() if len(lengths) == 1 else None
    if n is None or n == 0:
        sizes = ", ".join(f"{name!r}: {len(v)}" for name, v in values.items())
        raise ValueError(f"every curve needs the same, non-zero number of values, got {sizes}")
    x = np.arange(n) if positions is None else _to_numpy(positions).reshape(-1)
    if len(x) != n:
        raise ValueError(f"positions has {len(x)} entries but the curves have {n} values")
    fig, ax = _new_axes(ax, figsize=(7, 3.5))
    for (name, y), colour, style in zip(values.items(), CURVE_COLOURS, CURVE_STYLES):
        ax.plot(x, y, style, color=colour, linewidth=1.8, label=name)
    if mark is not None:
        ax.axvline(mark, color="tab:gray", linestyle=":", linewidth=1.5, label=mark_label)
    ax.grid(alpha=0.3)
    if legend_below:
        entries = len(values) + (mark is not None and mark_label is not None)
        ax.legend(fontsize=VALUE_SIZE, loc="upper center", bbox_to_anchor=(0.5, -0.18),
                  ncols=entries, frameon=False)
    else:
        ax.legend(fontsize=VALUE_SIZE)
    _label(ax, title, xlabel, ylabel)
    return fig, ax


def compare_runs(
    runs: Mapping[str, ArrayLike],
    x: ArrayLike | None = None,
    *,
    styles: Mapping[str, Mapping] | None = None,
    ax: Axes | None = None,
    title: str | None = None,
    xlabel: str = "step",
    ylabel: str = "loss",
    log_y: bool = False,
    legend: bool = True,
) -> tuple[Figure, Axes]:
    """Plot named series on one Axes to compare settings: a loss per step, a gradient norm
    per layer, and so on. A setting tried with several seeds is drawn as its median over a
    pale band from its lowest to its highest run.

    Args:
        runs: name -> values, shape (N,) for one run or (R, N) for R runs of one setting.
            Every series has the same N.
        x: the N x values (default 0 … N-1).
        styles: name -> keyword arguments for that series' line (``color``, ``linestyle``,
            ``marker``, …); by default the series take ``RUN_COLOURS`` in turn, solid.
        ax: Axes to draw on; a new figure is created when None.
        title, xlabel, ylabel: the figure's texts.
        log_y: a logarithmic y axis.
        legend: draw the legend (one entry per series).

    Returns:
        (fig, ax). The lines of ``ax`` are the series (the median where there are several
        runs), in the order of ``runs``, each labelled with its name; each band is a
        PolyCollection in ``ax.collections``.
    """
    if not runs:
        raise ValueError("runs is empty: give at least one named series")
    values = {name: _to_numpy(v) for name, v in runs.items()}
    for name, v in values.items():
        if v.ndim not in (1, 2) or v.shape[-1] == 0:
            raise ValueError(f"series {name!r} must have shape (N,) or (R, N) with N > 0, "
                             f"got {tuple(v.shape)}")
    lengths = {name: v.shape[-1] for name, v in values.items()}
    if len(set(lengths.values())) != 1:
        sizes = ", ".join(f"{name!r}: {n}" for name, n in lengths.items())
        raise ValueError(f"every series needs the same number of points, got {sizes}")
    n = next(iter(lengths.values()))
    xs = np.arange(n) if x is None else _to_numpy(x).reshape(-1)
    if len(xs) != n:
        raise ValueError(f"x has {len(xs)} entries but the series have {n} points")
    fig, ax = _new_axes(ax, figsize=(6, 3.5))
    for i, (name, v) in enumerate(values.items()):
        style = {"color": RUN_COLOURS[i % len(RUN_COLOURS)], "linewidth": 1.8}
        style.update((styles or {}).get(name, {}))
        if v.ndim == 2 and len(v) > 1:
            ax.fill_between(xs, v.min(axis=0), v.max(axis=0), color=style["color"], alpha=0.18,
                            linewidth=0)
            v = np.median(v, axis=0)
        ax.plot(xs, v.reshape(-1), label=name, **style)
    if log_y:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    if legend:
        ax.legend(fontsize=VALUE_SIZE)
    _label(ax, title, xlabel, ylabel)
    return fig, ax


def grouped_bars(
    series: Mapping[str, ArrayLike],
    labels: Sequence[str],
    *,
    ax: Axes | None = None,
    title: str | None = None,
    xlabel: str = "",
    ylabel: str = "value",
) -> tuple[Figure, Axes]:
    """Bars of several named series side by side at each of N labelled places, e.g. the
    probabilities of the likeliest next tokens at three temperatures.

    Args:
        series: name -> N values (at most ``len(RUN_COLOURS)`` series), each drawn in the
            next of ``RUN_COLOURS``; each name is the series' legend entry.
        labels: the N tick labels, one per place.
        ax: Axes to draw on; a new figure is created when None.
        title, xlabel, ylabel: the figure's texts.

    Returns:
        (fig, ax). ``ax.containers[j]`` holds the N bars of the j-th series of ``series``,
        labelled with its name; the bars of one place share 0.8 of the unit around it.
    """
    if not series or len(series) > len(RUN_COLOURS):
        raise ValueError(f"series must hold 1 to {len(RUN_COLOURS)} series, got {len(series)}")
    if len(labels) == 0:
        raise ValueError("labels is empty: give one label per place")
    values = {name: _to_numpy(v).reshape(-1) for name, v in series.items()}
    wrong = {name: len(v) for name, v in values.items() if len(v) != len(labels)}
    if wrong:
        sizes = ", ".join(f"{name!r}: {n}" for name, n in wrong.items())
        raise ValueError(f"every series needs one value per label ({len(labels)}), got {sizes}")
    n, width = len(values), 0.8 / len(values)
    places = np.arange(len(labels))
    fig, ax = _new_axes(ax, figsize=(7.5, 3.2))
    for j, ((name, v), colour) in enumerate(zip(values.items(), RUN_COLOURS)):
        ax.bar(places + (j - (n - 1) / 2) * width, v, width=width, color=colour, label=name)
    ax.set_xticks(places, labels=list(labels))
    ax.legend(fontsize=LABEL_SIZE)
    _label(ax, title, xlabel, ylabel)
    return fig, ax


# Colours of a KV-cache mask: a visible key in viridis's dark blue, a blocked one pale grey
# (told apart by lightness alone, so in any colour vision and in greyscale).
MASK_VISIBLE = "#31688e"
MASK_BLOCKED = "#eeeeee"


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
    m = _to_numpy(mask)
    if m.ndim != 2:
        raise ValueError(f"mask must be 2-D (T, S), got shape {tuple(m.shape)}")
    T, S = m.shape
    if cached < 0 or cached + T != S:
        raise ValueError(f"a mask of shape {(T, S)} needs cached = S - T = {S - T}, "
                         f"got cached = {cached}")
    rows = list(range(cached, cached + T)) if rope_rows is None else [int(r) for r in rope_rows]
    if len(rows) != T:
        raise ValueError(f"rope_rows has {len(rows)} entries but the mask has {T} rows")
    fig, ax = _new_axes(ax, figsize=(1.6 + 0.42 * S, 1.3 + 0.42 * T))
    cmap = matplotlib.colors.ListedColormap([MASK_BLOCKED, MASK_VISIBLE])
    ax.imshow(m, cmap=cmap, vmin=0.0, vmax=1.0)
    ax.set_xticks(range(S), labels=[str(j) for j in range(S)])
    ax.set_yticks(range(T), labels=[str(cached + i) for i in range(T)])
    ax.set_xticks(np.arange(-0.5, S), minor=True)
    ax.set_yticks(np.arange(-0.5, T), minor=True)
    ax.grid(which="minor", color="white", linewidth=1.5)
    ax.tick_params(which="minor", length=0)
    if cached > 0:
        ax.axvline(cached - 0.5, color="black", linewidth=2.5)
        ax.text((cached - 1) / 2, -0.7, "cached", ha="center", va="bottom", fontsize=VALUE_SIZE)
    ax.text(cached + (T - 1) / 2, -0.7, "new", ha="center", va="bottom", fontsize=VALUE_SIZE)
    right = ax.secondary_yaxis("right")
    right.set_yticks(range(T), labels=[str(r) for r in rows])
    right.tick_params(labelsize=TICK_SIZE)
    right.set_ylabel("RoPE row", fontsize=LABEL_SIZE)
    _label(ax, title, "key position", "query position")
    if title is not None:
        ax.set_title(title, fontsize=TITLE_SIZE, pad=18)  # room for "cached" / "new"
    return fig, ax


def memory_curves(
    lengths: Sequence[int] | ArrayLike,
    measured: Mapping[str, ArrayLike],
    *,
    reference: ArrayLike | None = None,
    reference_label: str = "reference",
    ax: Axes | None = None,
    title: str | None = None,
    xlabel: str = "sequence length T = S",
    ylabel: str = "peak memory above the inputs (MB)",
) -> tuple[Figure, Axes]:
    """Plot measured memory in bytes against a length on log-log axes, in MB (10⁶ bytes),
    several named curves over a pale reference line (e.g. the bytes of a T × S matrix).

    Args:
        lengths: N positive lengths, e.g. [512, 1024, ..., 8192] (a base-2 axis).
        measured: name -> N byte counts (at most ``len(CURVE_COLOURS)`` curves). A count of
            0, a rise below what the instrument resolves, has no place on a log axis: that
            point is left out of its curve.
        reference: N positive byte counts drawn as a wide pale line, or None.
        reference_label: the reference's legend entry.
        ax: Axes to draw on; a new figure is created when None.
        title, xlabel, ylabel: the figure's texts.

    Returns:
        (fig, ax). The lines of ``ax`` are the reference (when given), then the curves in the
        order of ``measured``, each labelled with its name, all in MB.
    """
    from matplotlib.ticker import FuncFormatter, NullLocator

    x = _to_numpy(lengths).reshape(-1)
    curves = {name: _to_numpy(v).reshape(-1) for name, v in measured.items()}
    if reference is not None:
        curves = {reference_label: _to_numpy(reference).reshape(-1), **curves}
    if not measured or len(measured) > len(CURVE_COLOURS):
        raise ValueError(f"measured needs 1 to {len(CURVE_COLOURS)} curves, got {len(measured)}")
    for name, y in curves.items():
        if len(y) != len(x):
            raise ValueError(f"{name!r} has {len(y)} values but there are {len(x)} lengths")
        measured_zero_ok = name in measured  # a measured 0 is left out; a reference's is not
        if np.any(x <= 0) or np.any(y < 0) or (not measured_zero_ok and np.any(y == 0)):
            raise ValueError(f"lengths must be positive and values positive (or 0 in a "
                             f"measured curve) for log-log axes, got lengths {x.tolist()} and "
                             f"{name!r} {y.tolist()}")
    curves = {name: np.where(y > 0, y, np.nan) for name, y in curves.items()}
    fig, ax = _new_axes(ax, figsize=(6, 3.8))
    if reference is not None:
        ax.plot(x, curves.pop(reference_label) / 1e6, "-", color="tab:gray", alpha=0.4,
                linewidth=6, label=reference_label)
    for i, (name, y) in enumerate(curves.items()):
        ax.plot(x, y / 1e6, marker="o", linestyle=CURVE_STYLES[i], color=CURVE_COLOURS[i],
                linewidth=1.8, label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(x, labels=[f"{v:g}" for v in x])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=VALUE_SIZE)
    _label(ax, title, xlabel, ylabel)
    return fig, ax
