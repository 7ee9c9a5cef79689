"""Interactive figures that work with a kernel *and* in the static book without one.

Every combination of an explorer's controls is rendered once to a small PNG; in the book the
controls choose among them in the browser (nested ``Stack`` s driven by ``jslink``), and with
ipywidgets 7 (Colab) a kernel callback does. :mod:`.frames` holds that machinery and
:class:`Explorer`, the widget every explorer returns (a VBox with its ``controls``,
``pictures`` and ``links`` named); :mod:`.attention` and :mod:`.rope` hold one explorer each.

Every control can be reached with Tab and moved with the arrow keys (sliders, and a
``Dropdown`` where there is a choice of names). The controls sit in rows that wrap, so on a
narrow screen each takes a full row; the pictures are drawn at about the width of the book's
content column (``FRAME_WIDTH``) and scale down with the container, never up.

The Stack-or-kernel switch is ``frames.HAS_STACK`` (``HAS_STACK`` here is its value at
import). The frame renderers (``_attention_frames``, ``_rope_pair_frames``, …) are importable
from here for tests that compare an explorer's pictures with them.
"""
from transformer_lib.plotting.style import DPI
from transformer_lib.tasks import decode_with_cross_attention
from transformer_lib.widgets.attention import (
    ATTENTION_FONT,
    AttentionExplorer,
    attention_explorer,
)
from transformer_lib.widgets.attention import _attention_frames as _attention_frames
from transformer_lib.widgets.frames import (
    COLOURS,
    CONTROL_MAX_WIDTH,
    CONTROL_WIDTH,
    FONT,
    FRAME_WIDTH,
    HAS_STACK,
    MAX_FRAMES,
    Explorer,
)
from transformer_lib.widgets.frames import _png_width as _png_width
from transformer_lib.widgets.rope import (
    KEY_OFFSET,
    ROPE_FRAME,
    RopeExplorer,
    rope_explorer,
)
from transformer_lib.widgets.rope import _rope_pair_frames as _rope_pair_frames
from transformer_lib.widgets.rope import _rope_score_frames as _rope_score_frames
from transformer_lib.widgets.rope import _rope_score_table as _rope_score_table

__all__ = [
    "attention_explorer", "rope_explorer", "Explorer", "AttentionExplorer", "RopeExplorer",
    "HAS_STACK", "DPI", "FONT", "ATTENTION_FONT", "FRAME_WIDTH", "COLOURS", "MAX_FRAMES",
    "CONTROL_WIDTH", "CONTROL_MAX_WIDTH", "KEY_OFFSET", "ROPE_FRAME",
    "decode_with_cross_attention",
]
