"""The cross-attention explorer of a sequence-reversal model (chapter 2 and the appendix).

Every map of a few decoded examples is rendered in advance (one frame per example, layer,
head and decoding step), so the explorer works in the static book; a collapsed live extra
decodes a typed sequence and needs a kernel.
"""
from __future__ import annotations

from typing import Callable, Sequence

import ipywidgets as widgets
import numpy as np
import torch
from matplotlib.artist import Artist
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from torch import Tensor

from transformer_lib.encoder_decoder import EncoderDecoder
from transformer_lib.plotting import attention_heatmap
from transformer_lib.plotting.style import DPI, ORANGE
from transformer_lib.tasks import decode_with_cross_attention, reversal_batch
from transformer_lib.widgets.frames import (
    FRAME_WIDTH,
    Explorer,
    _check_frames,
    _control_row,
    _labels,
    _linked_pictures,
    _picture_layout,
    _png_width,
    _render_frames,
)

#: The attention frames are ~750 px wide and shrink to 358 / 748 of that on a phone: text of
#: 15 pt, ticks 14 pt (19.4 px), stays 9.3 CSS px there. One set of frames serves both widths:
#: a narrow set would add ~0.9 MB to the chapter's page (2.65 MB in all, over its 2.5 MB).
ATTENTION_FONT = 15
#: What the explorer says when it is called without a trained model.
HOW_TO_GET_A_MODEL = ("train one first, e.g. `model, _ = train_reversal()` (from "
                      "transformer_lib.tasks, under a minute on a CPU), then call "
                      "`attention_explorer(model)`")


class AttentionExplorer(Explorer):
    """The widget :func:`attention_explorer` returns.

    Besides :class:`~transformer_lib.widgets.frames.Explorer`'s ``controls`` ``example``,
    ``layer``, ``head``, ``step``, ``pictures`` ``{"attention": …}`` and ``links``, it holds:

    Attributes:
        live: name -> widget of the live extra (``text``, ``button``, ``status``, ``image``).
        render_live: the live extra's callback: decode the typed sequence and draw its map.
    """

    live: dict[str, widgets.Widget]
    render_live: Callable[..., None]

    def __init__(self, children: Sequence[widgets.Widget], *, live: dict[str, widgets.Widget],
                 render_live: Callable[..., None], **parts) -> None:
        super().__init__(children, **parts)
        self.live, self.render_live = live, render_live


def _attention_frames(weights: Tensor, src: Sequence[int], out: Sequence[int], layer: int,
                      head: int, *, steps: bool = True) -> list[bytes]:
    """PNG frames of one cross-attention map ``weights`` ``(T, S)``, T == S, of the source
    tokens ``src`` (S) decoded into ``out`` (BOS + T tokens; ``out[:T]`` is the decoder input).

    Returns:
        Frame 0: all steps; frame ``1 + t``: row t (decoding step t) framed, later rows dimmed.
        Only frame 0 when ``steps`` is False.
    """
    T, S = weights.shape
    mirror = [S - 1 - t for t in range(T)]  # step t should copy source position S-1-t
    reference = np.zeros((T, S))
    reference[range(T), mirror] = 1
    picks = weights.argmax(dim=-1).tolist()  # (T,) source position each step looks at most
    hits = sum(p == m for p, m in zip(picks, mirror))

    # Cells wider than tall, so that a map of the default 8 steps fills the content column.
    fig = Figure(figsize=(min(FRAME_WIDTH, 2.2 + 0.66 * S), 1.9 + 0.45 * T), dpi=DPI,
                 layout="constrained")
    ax = fig.add_subplot()
    attention_heatmap(weights, [str(x) for x in src], ["BOS"] + [str(y) for y in out[1:T]],
                      ax=ax, reference=reference)
    ax.set_aspect("auto")
    _labels(ax, "source token", "decoder input", ATTENTION_FONT)
    fig.axes[-1].tick_params(labelsize=ATTENTION_FONT - 1)  # the colour bar
    shade = ax.add_patch(Rectangle((-0.5, 0), S, 0, facecolor="white", alpha=0.7, animated=True))
    frame = ax.add_patch(Rectangle((-0.5, 0), S, 1, fill=False, edgecolor=ORANGE, linewidth=2.5,
                                   animated=True))

    def draw(k: int) -> list[Artist]:
        if k == 0:
            ax.set_title(f"layer {layer}, head {head}: all steps\n"
                         f"argmax on the mirror in {hits}/{T} rows", fontsize=ATTENTION_FONT)
            return [ax.title]
        t = k - 1
        frame.set_y(t - 0.5)
        shade.set_bounds(-0.5, t + 0.5, S, T - 1 - t)  # rows t+1 .. T-1
        ax.set_title(f"layer {layer}, head {head}, step {t}: emits {out[t + 1]}\n"
                     f"looks at x[{picks[t]}]={src[picks[t]]}, "
                     f"mirror x[{mirror[t]}]={src[mirror[t]]}", fontsize=ATTENTION_FONT)
        return [shade, frame, ax.title]

    return _render_frames(fig, T + 1 if steps else 1, draw)


def _parse_sequence(text: str, model: EncoderDecoder) -> list[int]:
    """The symbols typed in ``text``: digits, or numbers separated by spaces or commas.

    Raises a ValueError saying what is allowed when ``text`` is not 1 to ``max_seq_len - 1``
    symbols in 1 .. V-1."""
    V = model.tgt_vocab_size
    try:
        parts = text.replace(",", " ").split() if (" " in text or "," in text) else list(text)
        tokens = [int(p) for p in parts]
    except ValueError:
        tokens = []
    too_long = len(tokens) + 1 > model.max_seq_len
    if not tokens or too_long or not all(1 <= x < V for x in tokens):
        raise ValueError(f"Type 1 to {model.max_seq_len - 1} symbols, each in 1..{V - 1} "
                         f"(digits, or numbers separated by spaces); got {text!r}.")
    return tokens


def _live_extra(model: EncoderDecoder, layer: widgets.IntSlider,
                head: widgets.IntSlider) -> tuple[widgets.Accordion, dict, Callable]:
    """The kernel-only part of :func:`attention_explorer`: type a sequence, see its map."""
    live = {"text": widgets.Text(value="", placeholder="e.g. 31415926", description="sequence"),
            "button": widgets.Button(description="Render"),
            "status": widgets.HTML(""),
            # Hidden until a kernel renders into it: an empty image would not load in the book.
            "image": widgets.Image(format="png", layout=widgets.Layout(display="none"))}
    live["text"].style.description_width = "80px"

    def render_live(_=None) -> None:
        """Decode the typed sequence and draw its map for the current layer and head."""
        try:
            tokens = _parse_sequence(live["text"].value.strip(), model)
        except ValueError as error:
            live["status"].value = str(error)
            return
        seq = torch.tensor([tokens])  # (1, S)
        seq_out, seq_weights = decode_with_cross_attention(model, seq)  # (1, 1+S), (L,1,H,S,S)
        l, h = layer.value, head.value
        picture = _attention_frames(seq_weights[l, 0, h], tokens, seq_out[0].tolist(), l, h,
                                    steps=False)[0]
        live["image"].value = picture
        live["image"].layout = _picture_layout(_png_width(picture))  # shown from now on
        decoded = seq_out[0, 1:].tolist()
        verdict = "correct" if decoded == tokens[::-1] else "not the reversal"
        live["status"].value = f"decoded: {' '.join(map(str, decoded))} ({verdict})"

    live["button"].on_click(render_live)
    live_box = widgets.VBox([
        widgets.HTML("<i>Needs a running kernel (Jupyter, Colab): in the static book these "
                     "controls do nothing.</i> Uses the layer and head chosen above."),
        _control_row(live["text"], live["button"]), live["status"], live["image"]])
    accordion = widgets.Accordion([live_box], selected_index=None)
    # ipywidgets 7 ignores Accordion(titles=...): set the title afterwards.
    accordion.set_title(0, "Live: your own sequence (needs a kernel)")
    # The book's stylesheet hides this class: without a kernel these controls do nothing.
    # Jupyter and Colab do not load that stylesheet, so there they stay.
    accordion.add_class("needs-kernel")
    return accordion, live, render_live


def _check_model(model: EncoderDecoder | None, seq_len: int) -> None:
    """Raise a TypeError if no model is given, a ValueError if it is not an EncoderDecoder
    or too short for ``seq_len``; both say how to get one."""
    if model is None:
        raise TypeError(f"attention_explorer needs a trained reversal model: "
                        f"{HOW_TO_GET_A_MODEL}")
    if not isinstance(model, EncoderDecoder):
        raise ValueError(f"model must be an EncoderDecoder, got {type(model).__name__}: "
                         f"{HOW_TO_GET_A_MODEL}")
    if seq_len + 1 > model.max_seq_len:
        raise ValueError(f"seq_len ({seq_len}) must be < the model's max_seq_len "
                         f"({model.max_seq_len})")


def attention_explorer(model: EncoderDecoder | None = None, *, n_examples: int = 3,
                       seq_len: int = 8, seed: int = 0) -> AttentionExplorer:
    """Explore the cross-attention maps of a sequence-reversal model, with or without a kernel.

    Args:
        model: required: a trained reversal model, e.g. ``model, _ = train_reversal()``
            (:func:`transformer_lib.tasks.train_reversal`). Without one a TypeError says so;
            nothing is trained here.
        n_examples: number of random source sequences to show.
        seq_len: length of the source sequences (and of the decoded output).
        seed: seeds the source sequences.

    Returns:
        An :class:`AttentionExplorer` (a VBox, shown as the widget): controls ``example``,
        ``layer``, ``head`` and ``step`` (an index; "all" first) over
        ``n_examples × L × H × (seq_len + 1)`` precomputed frames (``pictures["attention"]``),
        and a collapsed live extra (``live``, ``render_live``).
    """
    if n_examples < 1 or seq_len < 1:
        raise ValueError(f"n_examples ({n_examples}) and seq_len ({seq_len}) must be >= 1")
    _check_model(model, seq_len)
    L, H = len(model.decoder.layers), model.n_heads
    _check_frames("attention_explorer", {"examples": n_examples, "layers": L, "heads": H,
                                         "steps": seq_len + 1})
    src, _, _ = reversal_batch(n_examples, seq_len, model.tgt_vocab_size,
                               torch.Generator().manual_seed(seed))  # (n, S)
    out, weights = decode_with_cross_attention(model, src)  # (n, 1 + S), (L, n, H, S, S)
    frames = [[[_attention_frames(weights[l, e, h], src[e].tolist(), out[e].tolist(), l, h)
                for h in range(H)] for l in range(L)] for e in range(n_examples)]

    style = {"description_width": "80px"}
    controls = {
        "example": widgets.IntSlider(0, min=0, max=n_examples - 1, description="example",
                                     style=style),
        "layer": widgets.IntSlider(0, min=0, max=L - 1, description="layer", style=style),
        "head": widgets.IntSlider(0, min=0, max=H - 1, description="head", style=style),
        "step": widgets.SelectionSlider(options=["all"] + [str(t) for t in range(seq_len)],
                                        description="step", style=style),
    }
    picture, links = _linked_pictures(frames, [(controls["example"], "value"),
                                               (controls["layer"], "value"),
                                               (controls["head"], "value"),
                                               (controls["step"], "index")])
    caption = widgets.HTML(
        "<b>Cross-attention of the reversal model.</b> Rows: decoder inputs (BOS, then its own "
        "outputs); columns: source tokens; red boxes: the mirrored diagonal that reversal needs "
        "(step t copies source position S−1−t). Pick a step to frame its row: later rows are "
        "dimmed because the decoder has not produced them yet. All pictures are precomputed.")

    accordion, live, render_live = _live_extra(model, controls["layer"], controls["head"])
    return AttentionExplorer([caption, _control_row(*controls.values()), picture, accordion],
                             controls=controls, pictures={"attention": picture}, links=links,
                             live=live, render_live=render_live)
