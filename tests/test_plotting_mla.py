"""The MLA data-flow diagram (``transformer_lib/plotting/mla.py``): the sizes it writes are the
ones it is given, the cached boxes are the latent and the RoPE key, and it fits the column."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest
from matplotlib.patches import FancyBboxPatch

from transformer_lib.plotting import FIGURE_WIDTH, mla_data_flow

# Draws figures or explorer frames, seconds of CPU each: `make test` runs them, `make check` not.
pytestmark = pytest.mark.figures


def test_the_diagram_writes_the_sizes_it_is_given():
    fig, ax = mla_data_flow(d_model=64, kv_lora_rank=32, rope_dim=8, n_heads=4, head_dim=16)
    texts = " | ".join(t.get_text() for t in ax.texts)
    assert "cache: 40 numbers per token" in texts  # d_c + D_R
    assert "(64)" in texts and "(32)" in texts and "(8, all heads)" in texts
    assert "4 x 16" in texts
    boxes = [p for p in ax.patches if isinstance(p, FancyBboxPatch)]
    filled = sorted(p.get_label() for p in boxes if p.get_facecolor()[:3] != (1.0, 1.0, 1.0))
    assert filled == ["RoPE key $k_R$", "latent $c_{kv}$"]  # only these are cached
    assert fig.get_size_inches()[0] <= FIGURE_WIDTH
    plt.close(fig)


def test_the_diagram_draws_on_given_axes_and_refuses_bad_sizes():
    fig, ax = plt.subplots()
    got_fig, got_ax = mla_data_flow(ax=ax, title=None)
    assert got_ax is ax and got_fig is fig and ax.get_title() == ""
    plt.close(fig)
    with pytest.raises(ValueError, match="kv_lora_rank must be a positive integer, got 0"):
        mla_data_flow(kv_lora_rank=0)
