"""Figures for the course: attention maps, positional encodings, RoPE, learning rates, losses.

Every figure function takes ``ax=None`` (draw on a new figure) or an existing Axes, and
returns ``(fig, ax)`` so a notebook can add to the picture or save it. All of them share one
look, set in :mod:`~transformer_lib.plotting.style`: ``WEIGHT_CMAP`` for values in [0, 1],
``SIGNED_CMAP`` for signed values (both readable with the common colour-vision deficiencies:
no red-green scale anywhere), one line palette ``RUN_COLOURS``, and the same title, label and
tick sizes. Importing this package changes nothing global; a notebook asks for the book's look
once, with :func:`~.style.use_book_style` (every chapter's imports cell does): figures are
shown as SVG, sharp on any screen, and a new figure is at most ``FIGURE_WIDTH`` (5.4) inches
wide, so that on a 390 px phone its smallest text, 10 pt, stays 9 CSS px or more. Inputs may be
torch tensors or numpy arrays.

The figures live by subject: :mod:`.attention` (heatmap, text map, KV-cache mask),
:mod:`.positions` (positional encodings, RoPE, curves against the position) and
:mod:`.curves` (schedules, losses, variances, costs, runs, bars, memory), the drawn diagrams in
:mod:`.diagrams`, :mod:`.flows` (attention's data flow with shapes), :mod:`.mla` and
:mod:`.tiling`; every name is
imported from here, ``from transformer_lib.plotting import attention_heatmap``.
"""
from transformer_lib.plotting.attention import (
    TEXT_RAMP,
    attention_heatmap,
    attention_text,
    kv_cache_mask,
)
from transformer_lib.plotting.curves import (
    compare_runs,
    grouped_bars,
    loss_curve,
    lr_schedule,
    memory_curves,
    scaling_curve,
    score_variance,
)
from transformer_lib.plotting.diagrams import (
    gqa_heads,
    layer_structures,
    norm_placement,
    rope_pairings,
    speculative_steps,
    state_and_cache,
)
from transformer_lib.plotting.flows import attention_flow, encoder_decoder_flow, head_split_flow
from transformer_lib.plotting.mla import mla_data_flow
from transformer_lib.plotting.positions import (
    position_curves,
    positional_heatmap,
    rope_rotation,
)
from transformer_lib.plotting.style import (
    CURVE_COLOURS,
    CURVE_STYLES,
    FIGURE_WIDTH,
    LABEL_SIZE,
    MASK_BLOCKED,
    MASK_VISIBLE,
    MAX_WIDTH,
    RUN_COLOURS,
    SIGNED_CMAP,
    TICK_SIZE,
    TITLE_SIZE,
    VALUE_SIZE,
    WEIGHT_CMAP,
    ArrayLike,
    phone_text_px,
    use_book_style,
)
from transformer_lib.plotting.tiling import flash_tiling

__all__ = [
    # style
    "ArrayLike", "WEIGHT_CMAP", "SIGNED_CMAP", "MAX_WIDTH", "TITLE_SIZE", "LABEL_SIZE",
    "TICK_SIZE", "VALUE_SIZE", "RUN_COLOURS", "CURVE_STYLES", "CURVE_COLOURS",
    "MASK_VISIBLE", "MASK_BLOCKED", "FIGURE_WIDTH", "phone_text_px", "use_book_style",
    # attention
    "TEXT_RAMP", "attention_heatmap", "attention_text", "kv_cache_mask",
    # positions
    "positional_heatmap", "rope_rotation", "position_curves",
    # curves
    "lr_schedule", "loss_curve", "score_variance", "scaling_curve", "compare_runs",
    "grouped_bars", "memory_curves",
    # tiling
    "flash_tiling",
    # diagrams
    "mla_data_flow", "layer_structures", "gqa_heads", "attention_flow", "head_split_flow",
    "encoder_decoder_flow", "norm_placement", "rope_pairings", "speculative_steps",
    "state_and_cache",
]
