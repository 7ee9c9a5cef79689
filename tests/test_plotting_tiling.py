"""FlashAttention's tiling figure (``transformer_lib/plotting/tiling.py``): the tiles it draws
are the ones a causal loop computes, skips and masks, the arrows follow each loop order, and
the figure fits the column with readable text."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest

from transformer_lib.plotting import FIGURE_WIDTH, flash_tiling, phone_text_px

# Draws figures or explorer frames, seconds of CPU each: `make test` runs them, `make check` not.
pytestmark = pytest.mark.figures


def _patches(ax):
    return {p.get_gid(): p for p in ax.patches if p.get_gid()}


def test_causal_tiles_computed_skipped_and_masked():
    fig, ax = flash_tiling(5, 5, causal=True, current=(3, 1))
    tiles = {gid: p for gid, p in _patches(ax).items() if gid.startswith("S ")}
    assert len(tiles) == 25
    white = sorted(g for g, p in tiles.items() if p.get_facecolor()[:3] == (1.0, 1.0, 1.0))
    assert white == sorted(f"S {i},{j}" for i in range(5) for j in range(5) if j > i)  # 10
    hatched = sorted(g for g, p in tiles.items() if p.get_hatch())
    assert hatched == [f"S {i},{i}" for i in range(5)]
    in_sram = sorted(g for g, p in _patches(ax).items()
                     if p.get_facecolor()[:3] == matplotlib.colors.to_rgb("#E69F00"))
    assert in_sram == ["K 1", "O 3", "Q 3", "S 3,1"]
    plt.close(fig)


@pytest.mark.parametrize("order, along", [("fa1", "column"), ("fa2", "row")])
def test_the_inner_loop_runs_along_a_column_or_a_row(order, along):
    fig, ax = flash_tiling(4, 4, order=order, causal=False, current=(2, 1))
    arrow = _patches(ax)["inner loop"]
    (x_a, y_a), (x_b, y_b) = arrow._posA_posB
    assert (x_a == x_b and y_b < y_a) if along == "column" else (y_a == y_b and x_b > x_a)
    texts = " ".join(t.get_text() for t in ax.texts)
    assert ("rewritten per K/V tile" in texts) == (order == "fa1")
    assert ("written to HBM once" in texts) == (order == "fa2")
    plt.close(fig)


def test_fits_the_column_with_readable_text():
    fig, axes = plt.subplots(1, 2, figsize=(FIGURE_WIDTH, 3.1), layout="constrained")
    for ax, order in zip(axes, ("fa1", "fa2")):
        flash_tiling(order=order, ax=ax)
    fig.canvas.draw()
    texts = [t for t in fig.findobj(matplotlib.text.Text) if t.get_visible() and t.get_text()]
    assert min(phone_text_px(t.get_fontsize(), fig.get_figwidth()) for t in texts) >= 9 - 1e-9
    plt.close(fig)
    fig, _ = flash_tiling()
    assert fig.get_figwidth() <= FIGURE_WIDTH
    plt.close(fig)


@pytest.mark.parametrize("kwargs, message", [
    ({"order": "fa3"}, "order must be one of"),
    ({"n_q": 1}, r"n_q \(1\) and n_k \(4\) must be in 2 ... 8"),
    ({"n_q": 3, "n_k": 4}, r"n_q \(3\) must equal n_k \(4\)"),
    ({"current": (0, 2)}, r"current \(0, 2\) must be a computed tile"),
])
def test_bad_input_raises(kwargs, message):
    with pytest.raises(ValueError, match=message):
        flash_tiling(**kwargs)
