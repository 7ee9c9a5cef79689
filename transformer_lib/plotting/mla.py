"""A drawn diagram of multi-head latent attention (MLA): what each token is projected to,
what the cache keeps, and where the up-projections go on the explicit and the absorbed path.

Boxes and arrows are matplotlib patches, so the diagram renders alike in the book, in Jupyter
and in Colab.
"""
from __future__ import annotations

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle

from transformer_lib.plotting.style import (
    BLUE,
    GREY,
    LABEL_SIZE,
    ORANGE,
    TITLE_SIZE,
    VALUE_SIZE,
    new_axes,
)


def _box(ax: Axes, x: float, y: float, w: float, h: float, text: str, *,
         colour: str, filled: bool) -> None:
    """A rounded box centred at (x, y), ``w`` by ``h`` in data units, holding ``text``."""
    ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h,
                                boxstyle="round,pad=0.02,rounding_size=0.12",
                                facecolor=colour if filled else "white", edgecolor=colour,
                                alpha=1.0, linewidth=1.4,
                                label=text.split("\n")[0]))
    ax.text(x, y, text, ha="center", va="center", fontsize=VALUE_SIZE,
            color="black")


def _arrow(ax: Axes, start: tuple[float, float], end: tuple[float, float], text: str = "",
           *, offset: tuple[float, float] = (0.0, 0.18), dashed: bool = False) -> None:
    """An arrow from ``start`` to ``end`` with ``text`` written near its middle."""
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=11,
                                 linewidth=1.2, color="black",
                                 linestyle="--" if dashed else "-"))
    if text:
        mid = ((start[0] + end[0]) / 2 + offset[0], (start[1] + end[1]) / 2 + offset[1])
        ax.text(*mid, text, ha="center", va="center", fontsize=VALUE_SIZE)


def mla_data_flow(*, d_model: int = 2048, kv_lora_rank: int = 512, rope_dim: int = 64,
                  n_heads: int = 16, head_dim: int = 128, ax: Axes | None = None,
                  title: str | None = "What MLA caches, and what it rebuilds"
                  ) -> tuple[Figure, Axes]:
    """Draw MLA's data flow for one token: x → latent c_kv (and a RoPE key) → the cache →
    every head's keys and values, rebuilt by W_UK and W_UV or folded away when decoding.

    Args:
        d_model: C, the width of the token's hidden state.
        kv_lora_rank: d_c, the width of the cached latent.
        rope_dim: D_R, the width of the shared RoPE key.
        n_heads: H, attention heads.
        head_dim: D, the width of each head's key and value (without RoPE).
        ax: an Axes to draw on (None: a new figure 5.4 x 3.3 in).
        title: the title, or None.

    Returns:
        ``(fig, ax)``.
    """
    for name, value in (("d_model", d_model), ("kv_lora_rank", kv_lora_rank),
                        ("rope_dim", rope_dim), ("n_heads", n_heads), ("head_dim", head_dim)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    fig, ax = new_axes(ax, (5.4, 3.3))
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 6)
    ax.set_axis_off()
    # The cache: a dashed frame around the two things kept per token.
    ax.add_patch(Rectangle((2.75, 1.45), 2.7, 3.9, fill=False, edgecolor=ORANGE,
                           linestyle="--", linewidth=1.2))
    ax.text(4.1, 5.6, f"cache: {kv_lora_rank + rope_dim} numbers per token",
            ha="center", va="center", fontsize=VALUE_SIZE, color="black")
    _box(ax, 1.0, 3.4, 1.5, 0.9, f"token $x$\n({d_model})", colour=GREY, filled=False)
    _box(ax, 4.1, 4.3, 2.3, 0.9, f"latent $c_{{kv}}$\n({kv_lora_rank})", colour=ORANGE,
         filled=True)
    _box(ax, 4.1, 2.2, 2.3, 0.9, f"RoPE key $k_R$\n({rope_dim}, all heads)", colour=ORANGE,
         filled=True)
    _arrow(ax, (1.75, 3.6), (2.95, 4.2), r"$W_{DKV}$", offset=(-0.25, 0.3))
    _arrow(ax, (1.75, 3.2), (2.95, 2.3), r"$W_{KR}$, RoPE", offset=(-0.35, -0.35))
    _box(ax, 8.1, 4.9, 3.2, 0.8, f"keys $W_{{UK,h}}\\,c$: {n_heads} x {head_dim}",
         colour=BLUE, filled=False)
    _box(ax, 8.1, 3.7, 3.2, 0.8, f"values $W_{{UV,h}}\\,c$: {n_heads} x {head_dim}",
         colour=BLUE, filled=False)
    _arrow(ax, (5.25, 4.45), (6.5, 4.85))
    _arrow(ax, (5.25, 4.15), (6.5, 3.75))
    ax.text(8.1, 5.6, "training, prefill: rebuilt", ha="center", va="center",
            fontsize=VALUE_SIZE, color=BLUE)
    ax.text(8.1, 2.55, "decode (absorbed):\n$W_{UK,h}$ folds into the query,\n"
            "$W_{UV,h}$ into the output $W_O$", ha="center", va="center",
            fontsize=VALUE_SIZE)
    _arrow(ax, (5.25, 4.0), (6.45, 2.9), dashed=True)
    ax.text(4.1, 0.95, "nothing per head is cached", ha="center", va="center",
            fontsize=LABEL_SIZE)
    if title:
        ax.set_title(title, fontsize=TITLE_SIZE)
    return fig, ax
