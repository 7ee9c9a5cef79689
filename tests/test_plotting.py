import json
import math
import subprocess
import sys
import textwrap

import matplotlib

matplotlib.use("Agg")  # no windows; must come before pyplot is imported

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
from matplotlib.patches import Rectangle
from matplotlib.text import Annotation

from transformer_lib import plotting
from transformer_lib.positional import apply_rope, rope_cos_sin

# Draws figures or explorer frames, seconds of CPU each: `make test` runs them, `make check` not.
pytestmark = pytest.mark.figures


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def _softmax_rows(T: int, S: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(T, S, generator=generator).softmax(dim=-1)  # (T, S)


def _arrows(ax, prefix: str) -> list[Annotation]:
    return [t for t in ax.texts if isinstance(t, Annotation) and t.get_label().startswith(prefix)]


# attention_heatmap ---------------------------------------------------------------------


def test_attention_heatmap_shows_weights_labels_and_unit_colour_range():
    weights = _softmax_rows(3, 4)
    fig, ax = plotting.attention_heatmap(weights, ["a", "b", "c", "d"], ["x", "y", "z"], title="map")
    image = ax.images[0]
    np.testing.assert_allclose(np.asarray(image.get_array()), weights.numpy(), rtol=0, atol=1e-7)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "b", "c", "d"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["x", "y", "z"]
    assert image.get_clim() == (0.0, 1.0)
    assert image.colorbar is not None and image.colorbar.mappable is image
    assert ax.get_title() == "map"
    assert fig is ax.figure


def test_attention_heatmap_draws_on_given_axes():
    fig, ax = plt.subplots()
    fig_out, ax_out = plotting.attention_heatmap(np.eye(2))
    assert ax_out is not ax  # None -> new figure
    fig_out, ax_out = plotting.attention_heatmap(np.eye(2), ax=ax)
    assert ax_out is ax and fig_out is fig


def test_attention_heatmap_values_and_reference_outlines():
    weights = np.array([[0.25, 0.75], [1.0, 0.0]])
    reference = np.array([[0, 1], [1, 0]], dtype=bool)  # mirrored diagonal
    _, ax = plotting.attention_heatmap(weights, show_values=True, reference=reference)
    assert sorted(t.get_text() for t in ax.texts) == ["0.00", "0.25", "0.75", "1.00"]
    outlines = [p for p in ax.patches if isinstance(p, Rectangle)]
    assert sorted(p.get_xy() for p in outlines) == [(-0.5, 0.5), (0.5, -0.5)]  # cells (0,1), (1,0)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(weights=np.ones((2, 6)), x_labels=list("abcde")), "x_labels has 5 entries but weights has 6 columns"),
        (dict(weights=np.ones((2, 3)), y_labels=list("abc")), "y_labels has 3 entries but weights has 2 rows"),
        (dict(weights=np.ones((2, 3, 4))), r"got shape \(2, 3, 4\)"),
        (dict(weights=np.ones((2, 3)), reference=np.ones((3, 2))), r"reference has shape \(3, 2\)"),
    ],
)
def test_attention_heatmap_bad_shapes_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        plotting.attention_heatmap(**kwargs)


# attention_text ------------------------------------------------------------------------


def test_attention_text_identity_exact():
    text = plotting.attention_text(torch.eye(3), ["a", "b", "c"], ["x", "y", "z"])
    expected = "\n".join([
        "    a  b  c   <- key",
        "x   @",
        "y      @",
        "z         @",
        "^ query",
        "scale: ' .:-=+*#%@' = weight 0 ... 1",
    ])
    assert text == expected


def test_attention_text_ramp_and_alignment():
    weights = np.array([[0.0, 0.5, 0.95, 0.12]])
    lines = plotting.attention_text(weights, y_labels=["BOS"], key_name="source", query_name="step").split("\n")
    assert lines[0] == "      0  1  2  3   <- source"
    assert lines[1] == "BOS      +  @  ."
    assert lines[2] == "  ^ step"
    ramp = plotting.TEXT_RAMP
    assert ramp.index("+") in (len(ramp) // 2 - 1, len(ramp) // 2)  # 0.5 is a middle character
    # Each cell's character sits under the last character of its key label.
    assert [lines[1][lines[0].index(key)] for key in "123"] == ["+", "@", "."]


def test_attention_text_label_mismatch_raises():
    with pytest.raises(ValueError, match="x_labels has 2 entries but weights has 3 columns"):
        plotting.attention_text(np.eye(3), x_labels=["a", "b"])


# positional_heatmap --------------------------------------------------------------------


def _sinusoidal(T: int, C: int) -> np.ndarray:
    position = np.arange(T)[:, None]  # (T, 1)
    frequency = 10000.0 ** (-np.arange(0, C, 2) / C)  # (C/2,)
    pe = np.zeros((T, C))
    pe[:, 0::2] = np.sin(position * frequency)
    pe[:, 1::2] = np.cos(position * frequency)
    return pe


def test_positional_heatmap_symmetric_signed_scale():
    pe = _sinusoidal(10, 8)
    fig, ax = plotting.positional_heatmap(torch.tensor(pe), title="PE")
    image = ax.images[0]
    np.testing.assert_allclose(np.asarray(image.get_array()), pe, rtol=0, atol=1e-12)
    assert image.get_clim() == (-1.0, 1.0)
    assert image.get_cmap().name == plotting.SIGNED_CMAP
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("channel", "position")


def test_positional_heatmap_widens_scale_symmetrically():
    _, ax = plotting.positional_heatmap(np.array([[0.5, -3.0], [2.0, 0.0]]))
    assert ax.images[0].get_clim() == (-3.0, 3.0)
    with pytest.raises(ValueError, match=r"got shape \(4,\)"):
        plotting.positional_heatmap(np.zeros(4))


# rope_rotation -------------------------------------------------------------------------


def test_rope_rotation_arrow_ends_are_rotated_vectors():
    q, k, theta = np.array([0.8, 0.3]), np.array([-0.2, 0.9]), 0.4
    positions = [0, 1, 2, 5]
    fig, ax = plotting.rope_rotation(torch.tensor(q), positions, theta, k=k)
    for name, v in (("q", q), ("k", k)):
        arrows = _arrows(ax, f"{name},")
        assert len(arrows) == len(positions)
        for arrow, m in zip(arrows, positions):
            c, s = math.cos(m * theta), math.sin(m * theta)
            expected = (c * v[0] - s * v[1], s * v[0] + c * v[1])
            np.testing.assert_allclose(arrow.xy, expected, rtol=0, atol=1e-12)
            assert arrow.get_label() == f"{name}, m={m}"
            np.testing.assert_allclose(arrow.xyann, (0, 0))  # from the origin
    assert "$m$ = 5: 2.00 rad" in [t.get_text() for t in ax.texts]  # typeset
    assert ax.get_aspect() == 1.0


def test_rope_rotation_without_k_and_bad_shape():
    _, ax = plotting.rope_rotation([1.0, 0.0], [0, 1, 2], 0.5)
    assert len(_arrows(ax, "q,")) == 3 and _arrows(ax, "k,") == []
    with pytest.raises(ValueError, match=r"q must have 2 entries .* got shape \(3,\)"):
        plotting.rope_rotation(np.ones(3), [0], 0.1)


@pytest.mark.parametrize("pairing", ["interleaved", "half"])
def test_rope_rotation_draws_what_apply_rope_does_to_one_pair(pairing):
    """The arrows are apply_rope's output for channel pair i in either pairing; the axes keep
    the interleaved pairing's names, as the docstring says."""
    D, i, positions = 8, 1, [0, 1, 3, 7]
    x = torch.randn(D, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    channels = [2 * i, 2 * i + 1] if pairing == "interleaved" else [i, i + D // 2]
    cos, sin = rope_cos_sin(max(positions) + 1, D, dtype=torch.float64)  # (T, D/2) each
    rotated = apply_rope(x.expand(max(positions) + 1, D), cos, sin, pairing)  # (T, D)
    theta_i = 10000.0 ** (-2 * i / D)
    _, ax = plotting.rope_rotation(x[channels], positions, theta_i)
    for arrow, m in zip(_arrows(ax, "q,"), positions):
        np.testing.assert_allclose(arrow.xy, rotated[m, channels].numpy(), rtol=0, atol=1e-12)
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("channel $2i$", "channel $2i+1$")
    doc = " ".join(plotting.rope_rotation.__doc__.split())
    assert "interleaved pairing" in doc and "channels i and i + D/2" in doc


# lr_schedule ---------------------------------------------------------------------------


def test_lr_schedule_plots_function_and_marks_peak():
    d_model, warmup = 64, 40
    noam = lambda step: d_model**-0.5 * min(max(step, 1) ** -0.5, max(step, 1) * warmup**-1.5)  # noqa: E731
    steps = 200
    fig, ax = plotting.lr_schedule(noam, steps)
    expected = np.array([noam(s) for s in range(steps)])
    line = ax.lines[0]
    np.testing.assert_array_equal(line.get_xdata(), np.arange(steps))
    np.testing.assert_allclose(line.get_ydata(), expected, rtol=1e-12)
    annotations = [t for t in ax.texts if isinstance(t, Annotation)]
    assert len(annotations) == 1
    peak = int(np.argmax(expected))
    assert peak == warmup
    assert annotations[0].xy == (peak, expected[peak])
    assert f"step {peak}" in annotations[0].get_text()


def test_lr_schedule_without_peak_mark_on_given_axes():
    fig, ax = plt.subplots()
    fig_out, ax_out = plotting.lr_schedule(lambda s: 0.1 * s, 5, ax=ax, mark_peak=False)
    assert (fig_out, ax_out) == (fig, ax)
    assert len(ax.lines) == 1 and len(ax.texts) == 0


# loss_curve ----------------------------------------------------------------------------


def test_loss_curve_data_steps_and_log_scale():
    history = {"loss": [3.0, 2.0, 1.5, 1.2], "step": [10, 20, 30, 40]}
    _, ax = plotting.loss_curve(history, log_y=True, title="training")
    line = ax.lines[0]
    np.testing.assert_array_equal(line.get_ydata(), history["loss"])
    np.testing.assert_array_equal(line.get_xdata(), history["step"])
    assert ax.get_yscale() == "log" and ax.get_title() == "training"


def test_loss_curve_default_steps_and_errors():
    _, ax = plotting.loss_curve({"loss": [1.0, 0.5, 0.25]})
    np.testing.assert_array_equal(ax.lines[0].get_xdata(), [0, 1, 2])
    assert ax.get_yscale() == "linear"
    with pytest.raises(ValueError, match="history has 2 steps but 3 loss values"):
        plotting.loss_curve({"loss": [1.0, 0.5, 0.25], "step": [0, 1]})
    with pytest.raises(ValueError, match="'loss'"):
        plotting.loss_curve({"val_loss": [1.0]})


# score_variance ------------------------------------------------------------------------


def test_score_variance_plots_measurements_and_theory_on_log_axes():
    dims = [4, 16, 64]
    unscaled, scaled = [4.1, 15.8, 63.0], [1.02, 0.99, 0.98]
    fig, ax = plotting.score_variance(torch.tensor(dims), unscaled, np.array(scaled), title="var")
    labels = [line.get_label() for line in ax.lines]
    assert labels == ["$d_k$ (theory)", "1 (theory)", r"$q \cdot k$ (measured)",
                      r"$q \cdot k / \sqrt{d_k}$ (measured)"]
    for line, expected in zip(ax.lines, [dims, [1.0, 1.0, 1.0], unscaled, scaled]):
        np.testing.assert_array_equal(line.get_xdata(), dims)
        np.testing.assert_allclose(line.get_ydata(), expected, rtol=0, atol=1e-12)
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert ax.get_title() == "var" and fig is ax.figure
    assert ax.get_legend() is not None


def test_score_variance_on_given_axes_and_errors():
    fig, ax = plt.subplots()
    assert plotting.score_variance([2, 8], [2.0, 8.0], [1.0, 1.0], ax=ax) == (fig, ax)
    with pytest.raises(ValueError, match="d_k has 2 entries but unscaled has 1 and scaled has 2"):
        plotting.score_variance([2, 8], [2.0], [1.0, 1.0])
    with pytest.raises(ValueError, match="positive"):
        plotting.score_variance([0, 8], [2.0, 8.0], [1.0, 1.0])


# The house look: sized for the book's column, readable text, colour-blind-safe colours ---

# Sequential and diverging maps that stay readable with the common colour-vision deficiencies.
SAFE_CMAPS = {"viridis", "cividis", "magma", "inferno", "plasma", "RdBu", "RdBu_r", "PuOr", "PuOr_r"}


def _every_figure():
    """One new figure from every figure function, with inputs large enough to grow it."""
    noam = lambda step: 64**-0.5 * min(max(step, 1) ** -0.5, max(step, 1) * 40**-1.5)  # noqa: E731
    labels = [f"t{i}" for i in range(24)]
    return {
        "attention_heatmap": plotting.attention_heatmap(
            _softmax_rows(24, 24), labels, labels, title="a long map", show_values=True,
            reference=np.eye(24)),
        "positional_heatmap": plotting.positional_heatmap(_sinusoidal(64, 128), title="PE"),
        "rope_rotation": plotting.rope_rotation([0.8, 0.3], range(8), 0.4, k=[-0.2, 0.9], title="RoPE"),
        "lr_schedule": plotting.lr_schedule(noam, 400, title="Noam"),
        "loss_curve": plotting.loss_curve({"loss": np.linspace(3, 1, 50)}, title="loss"),
        "score_variance": plotting.score_variance([4, 16, 64], [4.1, 15.8, 63.0], [1.0, 1.0, 0.98]),
        "grouped_bars": plotting.grouped_bars(
            {f"series {j}": np.linspace(0.1, 0.9, 8) ** (j + 1) for j in range(3)},
            [f"label {i}" for i in range(8)], title="bars", ylabel="probability"),
        "position_curves": plotting.position_curves(
            {f"curve {i}": np.sin(np.arange(200) / (i + 1)) for i in range(5)}, mark=100,
            mark_label="mark", title="curves"),
    }


def _hue_saturation(colour) -> tuple[float, float]:
    r, g, b = matplotlib.colors.to_rgb(colour)
    h, s, _ = matplotlib.colors.rgb_to_hsv([r, g, b])
    return 360 * h, s


def _artist_colours(ax) -> list:
    colours = [line.get_color() for line in ax.lines]
    for patch in ax.patches:
        colours += [patch.get_edgecolor()] + ([patch.get_facecolor()] if patch.get_fill() else [])
    for text in ax.texts:  # annotations: their arrows and their text
        colours.append(text.get_color())
        if getattr(text, "arrow_patch", None) is not None:
            colours.append(text.arrow_patch.get_edgecolor())
    return [c for c in colours if matplotlib.colors.to_rgba(c)[3] > 0]


@pytest.mark.parametrize("name", list(_every_figure()))
def test_figures_fit_the_content_column_with_readable_text(name):
    """At most FIGURE_WIDTH = 5.4 in wide (518 CSS px as SVG, inside the 1366 px column), so
    that on a 390 px phone (column 350 px) every text of the figure, tick labels, colour bar,
    legend and notes included, is still at least 9 CSS px high."""
    fig, ax = _every_figure()[name]
    assert plotting.FIGURE_WIDTH == 5.4
    assert fig.get_figwidth() <= plotting.FIGURE_WIDTH + 1e-9
    fig.canvas.draw()
    for axes in fig.axes:  # the plot and its colour bar, if any
        ticks = axes.get_xticklabels() + axes.get_yticklabels()
        assert ticks
    texts = [t for t in fig.findobj(matplotlib.text.Text) if t.get_visible() and t.get_text()]
    assert texts
    smallest = min(plotting.phone_text_px(t.get_fontsize(), fig.get_figwidth()) for t in texts)
    assert smallest >= 9 - 1e-9, f"{name}: text of {smallest:.2f} CSS px on a phone"


def test_wide_heatmap_keeps_its_proportions_when_narrowed():
    fig, _ = plotting.attention_heatmap(_softmax_rows(4, 30))  # asks for 14.5 x 2.4 in
    width, height = fig.get_size_inches()
    assert width == pytest.approx(plotting.FIGURE_WIDTH)
    assert width / height == pytest.approx((1.0 + 0.45 * 30) / (0.6 + 0.45 * 4))


@pytest.mark.parametrize("name", list(_every_figure()))
def test_figures_use_colour_blind_safe_colours(name):
    """Colour maps from the safe list, and never red and green together in one plot (the pair
    that deuteranopia and protanopia, ~1 in 12 men, cannot tell apart)."""
    assert {plotting.WEIGHT_CMAP, plotting.SIGNED_CMAP} <= SAFE_CMAPS
    fig, ax = _every_figure()[name]
    for image in ax.images:
        assert image.get_cmap().name in SAFE_CMAPS
    hues = [_hue_saturation(c) for c in _artist_colours(ax)]
    red = any((h <= 20 or h >= 340) and s > 0.5 for h, s in hues)
    green = any(70 <= h <= 170 and s > 0.35 for h, s in hues)
    assert not (red and green), f"{name} draws red and green together"


def test_scaling_curve_draws_measurements_over_a_power_law():
    from transformer_lib.plotting import scaling_curve

    sizes = [128, 256, 512, 1024]
    times = [1e-4, 3e-4, 1.2e-3, 4.8e-3]
    fig, ax = scaling_curve(sizes, times, power=2, title="t")
    reference, measured = ax.get_lines()
    np.testing.assert_allclose(measured.get_ydata(), times)
    np.testing.assert_allclose(reference.get_ydata(), [4.8e-3 / 64, 4.8e-3 / 16, 4.8e-3 / 4, 4.8e-3])
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert "slope 2" in reference.get_label()
    with pytest.raises(ValueError, match="sizes has 2 entries but values has 1"):
        scaling_curve([1, 2], [1.0])
    with pytest.raises(ValueError, match="positive"):
        scaling_curve([1, 0], [1.0, 2.0])


def test_attention_heatmap_without_colour_bar_for_a_row_of_maps():
    fig, axes = plt.subplots(1, 3)
    for i, ax in enumerate(axes):
        plotting.attention_heatmap(torch.full((2, 3), 1 / 3), ax=ax, colorbar=i == 2)
    assert len(fig.axes) == 4  # three maps and one colour bar
    plt.close(fig)


def test_position_curves_draws_each_curve_and_the_mark():
    pe = _sinusoidal(40, 8)
    fig, ax = plotting.position_curves({"channel 0": pe[:, 0], "channel 4": torch.tensor(pe[:, 4])},
                                       positions=np.arange(10, 50), mark=30, mark_label="trained",
                                       ylabel="PE")
    first, second, mark = ax.get_lines()
    np.testing.assert_allclose(first.get_xdata(), np.arange(10, 50))
    np.testing.assert_allclose(second.get_ydata(), pe[:, 4])
    assert [first.get_label(), second.get_label(), mark.get_label()] == [
        "channel 0", "channel 4", "trained"]
    assert first.get_color() != second.get_color() and first.get_linestyle() != second.get_linestyle()
    assert list(mark.get_xdata()) == [30, 30]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("position", "PE")
    _, ax = plotting.position_curves({"only": [1.0, 2.0]})
    assert len(ax.get_lines()) == 1 and list(ax.get_lines()[0].get_xdata()) == [0, 1]


def test_position_curves_legend_below_the_plot_in_rows_of_two():
    fig, ax = plotting.position_curves({"a": [0.0, 1.0], "b": [1.0, 0.0]}, mark=0.5,
                                       mark_label="m", legend_below=True)
    fig.canvas.draw()
    legend = ax.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["a", "b", "m"]
    assert legend.get_window_extent().y1 < ax.get_window_extent().y0  # under the axes
    rows = {round(t.get_window_extent().y0) for t in legend.get_texts()}
    assert len(rows) == 2  # a, b / m
    for title in ("one line", "a title\non two lines"):  # a shorter plot: still under "position"
        fig, ax = plotting.position_curves({"a": [0.0, 1.0]}, legend_below=True, title=title)
        fig.canvas.draw()
        label = ax.xaxis.label.get_window_extent()
        assert ax.get_legend().get_window_extent().y1 < label.y0


def test_position_curves_legend_below_stays_inside_the_figure_width():
    """Four long entries side by side would widen the shown figure (its bounding box takes
    in the legend) and shrink its text on a phone; in rows of two they fit."""
    names = [f"pair {i}: wavelength {10 ** i}" for i in range(4)]
    fig, ax = plotting.position_curves({n: [0.0, 1.0] for n in names}, legend_below=True)
    fig.canvas.draw()
    legend = ax.get_legend().get_window_extent()
    assert legend.x0 >= 0 and legend.x1 <= fig.bbox.width


def test_log_axes_label_plain_numbers():
    """A log axis reads 0.2, 0.5, 1, 2, not 2 x 10^-1 (hard to read at a phone's size)."""
    runs = {"a": [0.2, 0.5, 1.0, 3.0, 6.0]}
    fig, ax = plotting.compare_runs(runs, log_y=True)
    fig.canvas.draw()
    labels = [t.get_text() for t in ax.get_yticklabels() + ax.get_yticklabels(minor=True)]
    shown = [label for label in labels if label]
    assert "1" in shown and "0.2" in shown and "2" in shown
    assert not any("10" in label and "^" in label or "e" in label for label in shown)
    assert not any("$" in label for label in shown)  # no mathtext powers


@pytest.mark.parametrize("kwargs, message", [
    ({"curves": {}}, "1 to 5 curves, got 0"),
    ({"curves": {str(i): [0.0] for i in range(6)}}, "1 to 5 curves, got 6"),
    ({"curves": {"a": [1.0, 2.0], "b": [1.0]}}, "'a': 2, 'b': 1"),
    ({"curves": {"a": [1.0, 2.0]}, "positions": [0, 1, 2]}, "positions has 3 entries"),
])
def test_position_curves_bad_input_raises(kwargs, message):
    with pytest.raises(ValueError, match=message):
        plotting.position_curves(**kwargs)


# the line colours --------------------------------------------------------------------------

# Okabe & Ito (2008), "Color Universal Design": the eight colours of their palette.
OKABE_ITO = {"#000000", "#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7"}


def test_line_colours_are_one_okabe_ito_palette():
    assert set(plotting.RUN_COLOURS) <= OKABE_ITO
    assert len(set(plotting.RUN_COLOURS)) == len(plotting.RUN_COLOURS) == 6
    assert plotting.CURVE_COLOURS == plotting.RUN_COLOURS[:len(plotting.CURVE_STYLES)]


def test_line_figures_give_their_nth_line_the_same_colour():
    data = {f"line {i}": np.arange(1.0, 5.0) * (i + 1) for i in range(5)}
    _, runs = plotting.compare_runs(data)
    _, curves = plotting.position_curves(data)
    _, memory = plotting.memory_curves([1, 2, 4, 8], data)
    colours = [[matplotlib.colors.to_hex(line.get_color()).upper() for line in ax.lines[:5]]
               for ax in (runs, curves, memory)]
    assert colours[0] == colours[1] == colours[2] == list(plotting.RUN_COLOURS[:5])


# compare_runs ------------------------------------------------------------------------------


def test_compare_runs_draws_single_runs_and_median_with_band():
    seeds = np.array([[3.0, 2.0, 1.0], [5.0, 4.0, 0.5], [4.0, 1.0, 0.8]])  # (R, N): 3 runs
    fig, ax = plotting.compare_runs({"one run": [1.0, 2.0, 3.0], "three seeds": seeds},
                                    x=[10, 20, 30], styles={"three seeds": {"linestyle": "--"}},
                                    log_y=True, title="runs", xlabel="step", ylabel="loss")
    single, median = ax.get_lines()
    assert [single.get_label(), median.get_label()] == ["one run", "three seeds"]
    np.testing.assert_allclose(single.get_xdata(), [10, 20, 30])
    np.testing.assert_allclose(median.get_ydata(), [4.0, 2.0, 0.8])  # the median per step
    assert median.get_linestyle() == "--" and single.get_linestyle() == "-"
    assert single.get_color() != median.get_color()
    (band,) = ax.collections  # only the setting with several runs has a band
    low_high = band.get_paths()[0].vertices[:, 1]
    assert low_high.min() == pytest.approx(0.5) and low_high.max() == pytest.approx(5.0)
    assert ax.get_yscale() == "log" and ax.get_legend() is not None
    assert (ax.get_title(), ax.get_xlabel(), ax.get_ylabel()) == ("runs", "step", "loss")


def test_compare_runs_on_given_axes_without_legend_and_default_x():
    fig, ax = plt.subplots()
    fig_out, ax_out = plotting.compare_runs({"a": torch.tensor([1.0, 2.0])}, ax=ax, legend=False)
    assert (fig_out, ax_out) == (fig, ax) and ax.get_legend() is None
    np.testing.assert_array_equal(ax.get_lines()[0].get_xdata(), [0, 1])


@pytest.mark.parametrize("kwargs, message", [
    ({"runs": {}}, "runs is empty"),
    ({"runs": {"a": np.ones((2, 2, 2))}}, r"'a' must have shape \(N,\) or \(R, N\)"),
    ({"runs": {"a": [1.0, 2.0], "b": [1.0]}}, "'a': 2, 'b': 1"),
    ({"runs": {"a": [1.0, 2.0]}, "x": [0, 1, 2]}, "x has 3 entries"),
])
def test_compare_runs_bad_input_raises(kwargs, message):
    with pytest.raises(ValueError, match=message):
        plotting.compare_runs(**kwargs)


def test_compare_runs_fits_the_column_in_colour_blind_safe_colours():
    """The house look of the other figures: at most FIGURE_WIDTH wide, text >= 9 pt, and its
    default colours (bands included) never red and green together."""
    runs = {f"setting {i}": np.random.default_rng(i).random((3, 40)) for i in range(6)}
    fig, ax = plotting.compare_runs(runs, title="six settings")
    assert fig.get_figwidth() <= plotting.FIGURE_WIDTH + 1e-9
    fig.canvas.draw()
    ticks = ax.get_xticklabels() + ax.get_yticklabels()
    assert all(t.get_fontsize() >= 9 for t in ticks if t.get_text())
    legend_texts = ax.get_legend().get_texts()
    assert all(t.get_fontsize() >= 9 for t in legend_texts + [ax.title, ax.xaxis.label])
    colours = _artist_colours(ax) + [c.get_facecolor()[0] for c in ax.collections]
    hues = [_hue_saturation(c) for c in colours]
    red = any((h <= 20 or h >= 340) and s > 0.5 for h, s in hues)
    green = any(70 <= h <= 170 and s > 0.35 for h, s in hues)
    assert not (red and green)


# grouped_bars --------------------------------------------------------------------------


def test_grouped_bars_places_each_series_beside_the_others():
    series = {"τ = 0.5": [0.7, 0.2, 0.1], "τ = 1.0": [0.5, 0.3, 0.2], "τ = 1.5": [0.4, 0.35, 0.25]}
    fig, ax = plotting.grouped_bars(series, ["a", "b", "space"], title="next character",
                                    ylabel="probability")
    assert [c.get_label() for c in ax.containers] == list(series)
    for j, (container, values) in enumerate(zip(ax.containers, series.values())):
        heights = [bar.get_height() for bar in container]
        centres = [bar.get_x() + bar.get_width() / 2 for bar in container]
        np.testing.assert_allclose(heights, values, rtol=0, atol=1e-12)
        np.testing.assert_allclose(centres, np.arange(3) + (j - 1) * 0.8 / 3, rtol=0, atol=1e-12)
        assert {matplotlib.colors.to_hex(bar.get_facecolor()).upper() for bar in container} == {
            plotting.RUN_COLOURS[j]}
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "b", "space"]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == list(series)
    assert ax.get_ylabel() == "probability" and ax.get_title() == "next character"


def test_grouped_bars_one_series_on_given_axes():
    fig, ax = plt.subplots()
    out_fig, out_ax = plotting.grouped_bars({"only": torch.tensor([1.0, 2.0])}, ["x", "y"], ax=ax)
    assert out_ax is ax and out_fig is fig
    centres = [bar.get_x() + bar.get_width() / 2 for bar in ax.containers[0]]
    np.testing.assert_allclose(centres, [0.0, 1.0], rtol=0, atol=1e-12)  # centred on the ticks


@pytest.mark.parametrize("series, labels, message", [
    ({}, ["a"], r"series must hold 1 to 6 series, got 0"),
    ({f"s{i}": [1.0] for i in range(7)}, ["a"], r"1 to 6 series, got 7"),
    ({"a": [1.0, 2.0]}, [], r"labels is empty"),
    ({"a": [1.0, 2.0], "b": [1.0]}, ["x", "y"], r"one value per label \(2\), got 'b': 1"),
])
def test_grouped_bars_bad_input_raises(series, labels, message):
    with pytest.raises(ValueError, match=message):
        plotting.grouped_bars(series, labels)


# kv_cache_mask -------------------------------------------------------------------------


def test_kv_cache_mask_draws_the_mask_the_split_and_the_positions():
    from transformer_lib.attention import causal_mask

    mask = causal_mask(3, 8)  # 5 cached positions, 3 new queries
    fig, ax = plotting.kv_cache_mask(mask, 5, title="chunk after 5")
    np.testing.assert_array_equal(np.asarray(ax.images[0].get_array()), mask.numpy())
    assert [t.get_text() for t in ax.get_yticklabels()] == ["5", "6", "7"]
    assert [t.get_text() for t in ax.get_xticklabels()] == [str(j) for j in range(8)]
    assert list(ax.lines[0].get_xdata()) == [4.5, 4.5]  # between key 4 and key 5
    assert {t.get_text() for t in ax.texts} == {"cached", "new"}
    assert [t.get_text() for t in ax.child_axes[0].get_yticklabels()] == ["5", "6", "7"]
    assert ax.get_title() == "chunk after 5"
    assert fig.get_figwidth() <= plotting.FIGURE_WIDTH


def test_kv_cache_mask_draws_a_buggy_rope_and_no_split_without_a_cache():
    from transformer_lib.attention import causal_mask

    _, ax = plotting.kv_cache_mask(torch.ones(2, 6).tril(), 4, rope_rows=[0, 1])
    assert [t.get_text() for t in ax.child_axes[0].get_yticklabels()] == ["0", "1"]
    _, ax = plotting.kv_cache_mask(causal_mask(4), 0)
    assert len(ax.lines) == 0 and {t.get_text() for t in ax.texts} == {"new"}


@pytest.mark.parametrize("args, message", [
    ((np.ones(4), 0), r"mask must be 2-D \(T, S\)"),
    ((np.ones((3, 8)), 4), r"needs cached = S - T = 5, got cached = 4"),
    ((np.ones((2, 4)), 2, [0]), "rope_rows has 1 entries but the mask has 2 rows"),
])
def test_kv_cache_mask_bad_input_raises(args, message):
    mask, cached, *rows = args
    with pytest.raises(ValueError, match=message):
        plotting.kv_cache_mask(mask, cached, rope_rows=rows[0] if rows else None)


# memory_curves -------------------------------------------------------------------------


def test_memory_curves_draws_the_reference_and_each_curve_in_mb_on_log_axes():
    lengths = [512, 1024, 2048]
    matrix = [4 * L * L for L in lengths]
    fig, ax = plotting.memory_curves(lengths, {"naive": [2 * m for m in matrix],
                                               "tiled": [1e6, 2e6, 4e6]},
                                     reference=matrix, reference_label="T x S", title="mem")
    reference, naive, tiled = ax.get_lines()
    np.testing.assert_allclose(reference.get_ydata(), [m / 1e6 for m in matrix])
    np.testing.assert_allclose(naive.get_ydata(), [2 * m / 1e6 for m in matrix])
    np.testing.assert_allclose(tiled.get_ydata(), [1, 2, 4])
    assert [line.get_label() for line in ax.get_lines()] == ["T x S", "naive", "tiled"]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["512", "1024", "2048"]
    assert fig.get_figwidth() <= plotting.FIGURE_WIDTH + 1e-9
    fig.canvas.draw()
    ticks = ax.get_xticklabels() + ax.get_yticklabels()
    assert all(t.get_fontsize() >= 9 for t in ticks if t.get_text())
    hues = [_hue_saturation(c) for c in _artist_colours(ax)]
    red = any((h <= 20 or h >= 340) and s > 0.5 for h, s in hues)
    green = any(70 <= h <= 170 and s > 0.35 for h, s in hues)
    assert not (red and green)
    _, ax = plotting.memory_curves(lengths, {"only": [1, 2, 3]})  # no reference line
    assert len(ax.get_lines()) == 1


@pytest.mark.parametrize("kwargs, message", [
    (dict(measured={}), "measured needs 1 to 5 curves, got 0"),
    (dict(measured={"a": [1, 2]}), "'a' has 2 values but there are 3 lengths"),
    (dict(measured={"a": [1, -1, 2]}), "values positive"),
    (dict(measured={"a": [1, 2, 3]}, reference=[1, 0, 2]), "values positive"),
    (dict(measured={"a": [1, 2, 3]}, reference=[1, 2]), "'reference' has 2 values"),
])
def test_memory_curves_bad_input_raises(kwargs, message):
    with pytest.raises(ValueError, match=message):
        plotting.memory_curves([1, 2, 4], **kwargs)


def test_memory_curves_leaves_a_measured_zero_out_of_its_curve():
    # A rise below the instrument's resolution reads 0, which a log axis cannot show.
    _, ax = plotting.memory_curves([1, 2, 4], {"a": [1e6, 0, 4e6]})
    y = ax.get_lines()[0].get_ydata()
    assert y[0] == 1.0 and np.isnan(y[1]) and y[2] == 4.0


# the package: every name in its old place, one style, one palette -------------------------

# The names chapters, handouts and tests import from transformer_lib.plotting.
PUBLIC_NAMES = [
    "ArrayLike", "WEIGHT_CMAP", "SIGNED_CMAP", "MAX_WIDTH", "TITLE_SIZE", "LABEL_SIZE",
    "TICK_SIZE", "VALUE_SIZE", "TEXT_RAMP", "RUN_COLOURS", "CURVE_STYLES", "CURVE_COLOURS",
    "MASK_VISIBLE", "MASK_BLOCKED", "FIGURE_WIDTH", "phone_text_px", "use_book_style",
    "attention_heatmap", "attention_text", "kv_cache_mask",
    "positional_heatmap", "rope_rotation", "position_curves", "lr_schedule", "loss_curve",
    "score_variance", "scaling_curve", "compare_runs", "grouped_bars", "memory_curves",
    "flash_tiling", "mla_data_flow", "layer_structures", "gqa_heads", "attention_flow",
    "head_split_flow", "encoder_decoder_flow", "norm_placement", "speculative_steps",
    "state_and_cache", "rope_pairings",
]


def test_the_package_exports_every_name_from_one_place():
    from transformer_lib.plotting import (
        attention,
        curves,
        diagrams,
        flows,
        mla,
        positions,
        style,
        tiling,
    )

    assert sorted(plotting.__all__) == sorted(PUBLIC_NAMES)
    homes = {"attention_heatmap": attention, "kv_cache_mask": attention,
             "rope_rotation": positions, "position_curves": positions,
             "compare_runs": curves, "memory_curves": curves, "RUN_COLOURS": style,
             "flash_tiling": tiling, "mla_data_flow": mla, "layer_structures": diagrams,
             "gqa_heads": diagrams, "attention_flow": flows, "head_split_flow": flows,
             "encoder_decoder_flow": flows, "norm_placement": diagrams,
             "speculative_steps": diagrams, "state_and_cache": diagrams,
             "rope_pairings": diagrams}
    for name, module in homes.items():
        assert getattr(plotting, name) is getattr(module, name)
    assert plotting.MAX_WIDTH == style.MAX_WIDTH == 7.5 and style.DPI == 100


def test_no_matplotlib_tab_colours_in_the_library():
    """Lines take the one palette (or the named grey); matplotlib's "tab:" cycle is not used."""
    from pathlib import Path

    lib = Path(plotting.__file__).resolve().parents[1]  # transformer_lib/
    found = [f"{path.relative_to(lib)}:{n}" for path in sorted(lib.rglob("*.py"))
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if '"tab:' in line or "'tab:" in line]
    assert not found, f"tab: colours in {found}"


def test_reference_lines_and_theory_bands_take_the_palette():
    from transformer_lib.plotting.style import BLUE, GREY, VERMILLION

    _, ax = plotting.score_variance([4, 16], [4.0, 16.0], [1.0, 1.0])
    colours = [matplotlib.colors.to_hex(line.get_color()).upper() for line in ax.lines]
    assert colours == [VERMILLION, BLUE, VERMILLION, BLUE]
    _, ax = plotting.scaling_curve([1, 2], [1.0, 4.0])
    assert [line.get_color() for line in ax.lines] == [GREY, BLUE]
    _, ax = plotting.lr_schedule(lambda step: step + 1.0, 3)
    assert ax.lines[1].get_color() == VERMILLION  # the peak


# the book's figures: sharp on every screen, readable on a phone ----------------------------


def test_phone_text_px_scales_text_to_the_phone_column():
    """10 pt is 13.3 CSS px at full size; a 5.4 in figure, 5.5 in with its margins (528 px),
    shrinks to 358 / 528 on the phone, 7.5 in to 358 / 730 (the old width: 6.5 px)."""
    assert plotting.phone_text_px(10, 5.4) == pytest.approx(9.04, abs=0.01)
    assert plotting.phone_text_px(10, 7.5) == pytest.approx(6.54, abs=0.01)
    assert plotting.phone_text_px(12, 3.0) == pytest.approx(16.0)  # narrow: not shrunk
    with pytest.raises(ValueError, match=r"size_pt \(0\) and width_in \(5.4\)"):
        plotting.phone_text_px(0, 5.4)


def test_book_style_shows_figures_as_svg_in_ipython():
    """The style, once asked for, makes IPython show a figure as SVG (vector: sharp at
    any density) and no longer as a 1x PNG, also after the inline backend is activated."""
    from IPython.core.interactiveshell import InteractiveShell
    from matplotlib_inline.backend_inline import configure_inline_support
    from matplotlib_inline.config import InlineBackend

    shell = InteractiveShell.instance()
    formatters = shell.display_formatter.formatters
    fig, _ = plotting.loss_curve({"loss": [3.0, 2.0, 1.5]})
    assert plotting.use_book_style(shell) is True
    assert InlineBackend.instance().figure_formats == {"svg"}
    assert InlineBackend.instance().print_figure_kwargs["pad_inches"] == plotting.style.SVG_PAD
    svg = formatters["image/svg+xml"](fig)
    assert svg is not None and "<svg" in svg
    assert formatters["image/png"](fig) is None  # no 1x PNG beside it
    configure_inline_support.current_backend = "unset"  # as at a kernel's first figure
    configure_inline_support(shell, "inline")
    assert formatters["image/svg+xml"](fig) is not None
    assert formatters["image/png"](fig) is None
    assert plt.rcParams["figure.figsize"][0] == plotting.FIGURE_WIDTH  # figures made bare


# What an import does: nothing global. A fresh interpreter (here, plotting is long imported)
# records matplotlib's rcParams and an IPython shell's figure formatters, imports, records again.
_GLOBAL_STATE = textwrap.dedent("""
    import json, sys
    import matplotlib
    matplotlib.use("Agg")
    from IPython.core.interactiveshell import InteractiveShell
    from matplotlib.figure import Figure

    shell = InteractiveShell.instance()  # what get_ipython() returns from now on

    def state():
        formats = {}
        for mime, formatter in shell.display_formatter.formatters.items():
            try:
                formats[mime] = repr(formatter.lookup_by_type(Figure))
            except KeyError:
                formats[mime] = None
        rc = {key: repr(value) for key, value in matplotlib.rcParams.items()}
        return {"rc": rc, "formats": formats}

    before = state()
    exec(sys.argv[1])
    after = state()
    print(json.dumps({part: sorted(key for key in before[part]
                                   if before[part][key] != after[part].get(key))
                      for part in before}))
""")


def _changed_by(statement: str) -> dict[str, list[str]]:
    """The rcParams keys and IPython mime types whose Figure printer ``statement`` changed,
    run in a fresh interpreter."""
    run = subprocess.run([sys.executable, "-c", _GLOBAL_STATE, statement], capture_output=True,
                         text=True, timeout=300, check=True)
    return json.loads(run.stdout.splitlines()[-1])


def test_importing_plotting_and_widgets_changes_no_global_state():
    """Importing the figures and the explorers leaves matplotlib's rcParams and IPython's
    display formatters alone; a notebook asks for the book's look with use_book_style(),
    which changes both (so the probe sees such a change)."""
    assert _changed_by("import transformer_lib.plotting, transformer_lib.widgets") == {
        "rc": [], "formats": []}
    asked = _changed_by("from transformer_lib.plotting import use_book_style; use_book_style()")
    assert {"figure.figsize", "axes.prop_cycle", "svg.hashsalt"} <= set(asked["rc"])
    assert "image/svg+xml" in asked["formats"]


def test_use_book_style_outside_ipython_sets_the_look_only():
    plt.rcParams["xtick.labelsize"] = 6
    assert plotting.use_book_style(shell=None) in (True, False)
    assert plt.rcParams["xtick.labelsize"] == plotting.TICK_SIZE
    assert plt.rcParams["svg.fonttype"] == "path"  # the same glyphs without the fonts


@pytest.mark.parametrize("draw", [
    lambda: plotting.attention_heatmap(_softmax_rows(3, 5)),
    lambda: plotting.positional_heatmap(np.sin(np.arange(20 * 8).reshape(20, 8))),
    lambda: plotting.kv_cache_mask(np.tril(np.ones((2, 5)), k=3), 3),
])
def test_heatmaps_embed_one_pixel_per_cell_drawn_sharp(draw):
    """In an SVG a heatmap is one embedded image of one pixel per cell, which the browser
    draws as sharp squares (not blurred) at any size and screen density."""
    import base64
    import io
    import re

    from PIL import Image

    fig, ax = draw()
    rows, cols = ax.images[0].get_array().shape
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg")
    svg = buffer.getvalue()
    images = [tag for tag in re.findall(r"<image [^>]*>", svg)  # a colour bar is one more
              if "image-rendering:pixelated" in tag]
    assert len(images) == 1
    data = re.search(r'xlink:href="data:image/png;base64,([^"]+)"', images[0]).group(1)
    assert Image.open(io.BytesIO(base64.b64decode(data))).size == (cols, rows)


def test_kv_cache_mask_title_clears_its_captions_and_the_panel_above():
    """Two masks stacked as in the KV-cache chapter: each title sits above "cached" / "new",
    which sit above the mask, and nothing overprints the x label of the panel above."""
    fig, axes = plt.subplots(2, 1, figsize=(5.4, 5.0), layout="constrained")
    mask = np.tril(np.ones((3, 8)), k=5)  # (T, S): 5 cached keys, then causal
    plotting.kv_cache_mask(mask, 5, ax=axes[0], title="causal_mask(3, 8)")
    plotting.kv_cache_mask(mask, 5, rope_rows=range(3), ax=axes[1], title="offset forgotten")
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in axes:
        title = ax.title.get_window_extent(renderer)
        top = ax.get_window_extent(renderer).y1
        for caption in ax.texts:
            box = caption.get_window_extent(renderer)
            assert top <= box.y0 and box.y1 <= title.y0, caption.get_text()
    label_above = axes[0].xaxis.label.get_window_extent(renderer)
    assert axes[1].title.get_window_extent(renderer).y1 < label_above.y0
