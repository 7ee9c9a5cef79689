"""Line and bar figures: learning-rate schedules, losses, score variances, costs against a
size, runs compared, grouped bars and measured memory.

Each figure function takes ``ax=None`` (draw on a new figure) or an existing Axes and returns
``(fig, ax)``; inputs may be torch tensors or numpy arrays (see :mod:`.style` for the look).
"""
from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullLocator

from transformer_lib.plotting.style import (
    BLUE,
    CURVE_COLOURS,
    CURVE_STYLES,
    GREY,
    LABEL_SIZE,
    RUN_COLOURS,
    VALUE_SIZE,
    VERMILLION,
    ArrayLike,
    label_axes,
    new_axes,
    plain_log_ticks,
    to_numpy,
)


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
    fig, ax = new_axes(ax, figsize=(5.4, 3.2))
    ax.plot(np.arange(steps), lrs)
    if mark_peak:
        peak = int(np.argmax(lrs))
        ax.plot([peak], [lrs[peak]], "o", color=VERMILLION)
        ax.annotate(f"peak {lrs[peak]:.2e} at step {peak}", xy=(peak, lrs[peak]),
                    xytext=(10, -15), textcoords="offset points", fontsize=VALUE_SIZE)
    label_axes(ax, title, "step", "learning rate")
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
    loss = to_numpy(history["loss"])
    steps = to_numpy(history["step"]) if "step" in history else np.arange(len(loss))
    if len(steps) != len(loss):
        raise ValueError(f"history has {len(steps)} steps but {len(loss)} loss values")
    fig, ax = new_axes(ax, figsize=(5.4, 3.2))
    ax.plot(steps, loss, label="loss")
    if log_y:
        ax.set_yscale("log")
        plain_log_ticks(ax.yaxis)
    ax.grid(alpha=0.3)
    label_axes(ax, title, "step", "loss")
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
    unit-variance components: var(q·k) = d_k (vermillion) and var(q·k/√d_k) = 1 (blue).
    The labels are typeset as math.

    Args:
        d_k: N head dimensions (positive), e.g. [4, 16, 64, 256].
        unscaled: N measured variances of q·k, one per d_k.
        scaled: N measured variances of q·k/√d_k, one per d_k.
        ax: Axes to draw on; a new figure is created when None.
        title: figure title.

    Returns:
        (fig, ax). The lines are labelled "$d_k$ (theory)", "1 (theory)",
        "$q \\cdot k$ (measured)" and "$q \\cdot k / \\sqrt{d_k}$ (measured)", in that order.
    """
    dims = to_numpy(d_k).reshape(-1)
    raw = to_numpy(unscaled).reshape(-1)
    norm = to_numpy(scaled).reshape(-1)
    if len(raw) != len(dims) or len(norm) != len(dims):
        raise ValueError(
            f"d_k has {len(dims)} entries but unscaled has {len(raw)} and scaled has {len(norm)}"
        )
    if len(dims) == 0 or np.any(dims <= 0):
        raise ValueError(f"d_k must be a non-empty list of positive sizes, got {dims.tolist()}")
    fig, ax = new_axes(ax, figsize=(5.4, 3.4))
    # Theory first, as wide pale bands, so that the measurements drawn on top stay visible.
    ax.plot(dims, dims, "-", color=VERMILLION, alpha=0.25, linewidth=6, label="$d_k$ (theory)")
    ax.plot(dims, np.ones_like(dims), "-", color=BLUE, alpha=0.25, linewidth=6,
            label="1 (theory)")
    ax.plot(dims, raw, "o:", color=VERMILLION, label=r"$q \cdot k$ (measured)")
    ax.plot(dims, norm, "s:", color=BLUE, label=r"$q \cdot k / \sqrt{d_k}$ (measured)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=LABEL_SIZE)
    label_axes(ax, title, "head dimension $d_k$", "variance of the score")
    return fig, ax


def scaling_curve(
    sizes: Sequence[int] | ArrayLike,
    values: ArrayLike,
    *,
    power: float = 2.0,
    ax: Axes | None = None,
    title: str | None = None,
    xlabel: str = "sequence length $T$",
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
        (fig, ax). The lines are the reference ("$\\propto T^{power}$ (slope power)", typeset)
        and the measurements, in that order.
    """
    x = to_numpy(sizes).reshape(-1).astype(float)
    y = to_numpy(values).reshape(-1).astype(float)
    if len(x) != len(y) or len(x) == 0:
        raise ValueError(f"sizes has {len(x)} entries but values has {len(y)}; both must be "
                         "equal and non-empty")
    if np.any(x <= 0) or np.any(y <= 0):
        raise ValueError("sizes and values must be positive for log-log axes, got "
                         f"sizes {x.tolist()} and values {y.tolist()}")
    fig, ax = new_axes(ax, figsize=(5.4, 3.2))
    reference = y[-1] * (x / x[-1]) ** power
    ax.plot(x, reference, "-", color=GREY, alpha=0.4, linewidth=6,
            label=f"$\\propto T^{{{power:g}}}$ (slope {power:g})")
    ax.plot(x, y, "o:", color=BLUE, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=LABEL_SIZE)
    label_axes(ax, title, xlabel, ylabel)
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
    values = {name: to_numpy(v) for name, v in runs.items()}
    for name, v in values.items():
        if v.ndim not in (1, 2) or v.shape[-1] == 0:
            raise ValueError(f"series {name!r} must have shape (N,) or (R, N) with N > 0, "
                             f"got {tuple(v.shape)}")
    lengths = {name: v.shape[-1] for name, v in values.items()}
    if len(set(lengths.values())) != 1:
        sizes = ", ".join(f"{name!r}: {n}" for name, n in lengths.items())
        raise ValueError(f"every series needs the same number of points, got {sizes}")
    n = next(iter(lengths.values()))
    xs = np.arange(n) if x is None else to_numpy(x).reshape(-1)
    if len(xs) != n:
        raise ValueError(f"x has {len(xs)} entries but the series have {n} points")
    fig, ax = new_axes(ax, figsize=(5.4, 3.2))
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
        plain_log_ticks(ax.yaxis)
    ax.grid(alpha=0.3)
    if legend:
        ax.legend(fontsize=VALUE_SIZE)
    label_axes(ax, title, xlabel, ylabel)
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
    values = {name: to_numpy(v).reshape(-1) for name, v in series.items()}
    wrong = {name: len(v) for name, v in values.items() if len(v) != len(labels)}
    if wrong:
        sizes = ", ".join(f"{name!r}: {n}" for name, n in wrong.items())
        raise ValueError(f"every series needs one value per label ({len(labels)}), got {sizes}")
    n, width = len(values), 0.8 / len(values)
    places = np.arange(len(labels))
    fig, ax = new_axes(ax, figsize=(5.4, 3.2))
    for j, ((name, v), colour) in enumerate(zip(values.items(), RUN_COLOURS)):
        ax.bar(places + (j - (n - 1) / 2) * width, v, width=width, color=colour, label=name)
    ax.set_xticks(places, labels=list(labels))
    ax.legend(fontsize=LABEL_SIZE)
    label_axes(ax, title, xlabel, ylabel)
    return fig, ax


def memory_curves(
    lengths: Sequence[int] | ArrayLike,
    measured: Mapping[str, ArrayLike],
    *,
    reference: ArrayLike | None = None,
    reference_label: str = "reference",
    ax: Axes | None = None,
    title: str | None = None,
    xlabel: str = "sequence length $T = S$",
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
    x = to_numpy(lengths).reshape(-1)
    curves = {name: to_numpy(v).reshape(-1) for name, v in measured.items()}
    if reference is not None:
        curves = {reference_label: to_numpy(reference).reshape(-1), **curves}
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
    fig, ax = new_axes(ax, figsize=(5.4, 3.6))
    if reference is not None:
        ax.plot(x, curves.pop(reference_label) / 1e6, "-", color=GREY, alpha=0.4,
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
    label_axes(ax, title, xlabel, ylabel)
    return fig, ax
