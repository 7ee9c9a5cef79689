"""Interactive figures that work with a kernel *and* in the static book without one.

Every combination of an explorer's controls is rendered once to a small PNG; in the book the
controls choose among them in the browser (nested ``Stack`` s driven by ``jslink``), and with
ipywidgets 7 (Colab) a kernel callback does. :mod:`.frames` holds that machinery and
:class:`~transformer_lib.widgets.frames.Explorer`, the widget every explorer returns (a VBox with
its ``controls``, ``pictures`` and ``links`` named; a frame is a PNG, or a short HTML text where
the picture is text). Each other module holds one chapter's explorer: :mod:`.softmax` (chapter 1),
:mod:`.attention` (2), :mod:`.heads` (3), :mod:`.norms` (4), :mod:`.rope` (5), :mod:`.sampling`
(6), :mod:`.kv_memory` (7), :mod:`.online_softmax` (8), :mod:`.recall` (9).

Every control can be reached with Tab and moved with the arrow keys (sliders, and a
``Dropdown`` where there is a choice of names). The controls sit in rows that wrap, so on a
narrow screen each takes a full row; the pictures are drawn at about the width of the book's
content column (``FRAME_WIDTH``) and scale down with the container, never up. On a phone,
where that would shrink their text below 9 px, the book shows a second, narrow set of the
same frames instead (about 360 px wide, larger text, panels one above the other; the
explorer's ``narrow`` pictures, driven by the same controls): see :mod:`.frames`.

The Stack-or-kernel switch is ``frames.HAS_STACK`` (``HAS_STACK`` here is its value at
import). The frame renderers (``_attention_frames``, ``_rope_pair_frames``, …) stay in their
modules (``transformer_lib.widgets.attention`` and so on).
"""
from transformer_lib.plotting.style import DPI
from transformer_lib.widgets.attention import (
    ATTENTION_FONT,
    AttentionExplorer,
    attention_explorer,
)
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
from transformer_lib.widgets.heads import (
    TWO_READS_HEADS_FILE,
    HeadsExplorer,
    heads_explorer,
    load_two_reads_heads,
)
from transformer_lib.widgets.kv_memory import (
    KV_CONTEXTS,
    KV_DTYPES,
    KV_HEAD_CHOICES,
    KV_PRESETS,
    KvMemoryExplorer,
    kv_memory_explorer,
)
from transformer_lib.widgets.norms import (
    GRADIENT_PROFILE_FILE,
    GradientExplorer,
    gradient_explorer,
    load_gradient_profile,
)
from transformer_lib.widgets.online_softmax import (
    OnlineSoftmaxExplorer,
    OnlineSteps,
    online_softmax_explorer,
)
from transformer_lib.widgets.recall import RECALL_FONT, RecallExplorer, recall_explorer
from transformer_lib.widgets.rope import (
    KEY_OFFSET,
    ROPE_FRAME,
    RopeExplorer,
    rope_explorer,
)
from transformer_lib.widgets.sampling import (
    SAMPLING_FONT,
    SamplingExplorer,
    sampling_explorer,
)
from transformer_lib.widgets.softmax import (
    SCALINGS,
    SOFTMAX_DIMS,
    SOFTMAX_FONT,
    SoftmaxExplorer,
    softmax_explorer,
)

__all__ = [
    "attention_explorer", "rope_explorer", "Explorer", "AttentionExplorer", "RopeExplorer",
    "HAS_STACK", "DPI", "FONT", "ATTENTION_FONT", "FRAME_WIDTH", "COLOURS", "MAX_FRAMES",
    "CONTROL_WIDTH", "CONTROL_MAX_WIDTH", "KEY_OFFSET", "ROPE_FRAME",
    "heads_explorer", "HeadsExplorer", "load_two_reads_heads", "TWO_READS_HEADS_FILE",
    "kv_memory_explorer", "KvMemoryExplorer", "KV_PRESETS", "KV_CONTEXTS", "KV_HEAD_CHOICES",
    "KV_DTYPES",
    "online_softmax_explorer", "OnlineSoftmaxExplorer", "OnlineSteps",
    "sampling_explorer", "SamplingExplorer", "SAMPLING_FONT",
    "gradient_explorer", "GradientExplorer", "load_gradient_profile", "GRADIENT_PROFILE_FILE",
    "softmax_explorer", "SoftmaxExplorer", "SOFTMAX_DIMS", "SCALINGS", "SOFTMAX_FONT",
    "recall_explorer", "RecallExplorer", "RECALL_FONT",
]
