"""Interactive figures that work with a kernel *and* in the static book without one.

A picture drawn by a Python callback (``interact``, ``interactive_output``) never updates
on a page without a kernel. So every combination of the controls is rendered once to a small
PNG; the PNGs are ``widgets.Image`` leaves of nested ``widgets.Stack`` s (one level per
control) and each control drives its level's ``selected_index`` through ``widgets.jslink``,
which runs in the browser: the book's embedded widget state is enough. Controls are integer
indices: ``IntSlider(min=0)``, or a selection widget linked by ``index`` (its ``value`` is
not synced to the browser). Frames are drawn on bare ``Figure`` s with the Agg canvas (pyplot
and its backend are never touched), the static part once per figure (blitting), and stored
as palette PNGs. The live extra of :func:`attention_explorer` needs a kernel; the static
part does not depend on it.

With a kernel whose ipywidgets has no ``Stack`` (ipywidgets 7, which Colab ships), the same
explorers show one ``Image`` and update it in the kernel: moving a control sets the picture
from the same precomputed frames (an ``observe`` callback), and only ipywidgets 7 core
controls are used. The path is chosen by capability (``HAS_STACK``), not by guessing the
host.

Every control can be reached with Tab and moved with the arrow keys (sliders, and a
``Dropdown`` where there is a choice of names). The controls sit in rows that wrap, so on a
narrow screen each takes a full row; the pictures are drawn at about the width of the
book's content column (``FRAME_WIDTH``) and scale down with the container, never up.
"""
from __future__ import annotations

import io
from typing import Callable, Sequence

import ipywidgets as widgets
import numpy as np
import torch
from matplotlib.artist import Artist
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Circle, FancyArrowPatch, Rectangle
from PIL import Image as PILImage
from torch import Tensor

from transformer_lib.encoder_decoder import EncoderDecoder
from transformer_lib.plotting import attention_heatmap
from transformer_lib.positional import PAIRINGS, apply_rope, rope_cos_sin
from transformer_lib.tasks import decode_with_cross_attention, reversal_batch, train_reversal

# ipywidgets 8 has Stack (the static book's path); ipywidgets 7 (Colab) does not: there the
# pictures update through the kernel instead.
HAS_STACK = hasattr(widgets, "Stack")
DPI = 100  # frame resolution, as matplotlib's inline figures: one pixel per CSS pixel
FONT = 12  # titles and axis labels inside frames; tick labels one point smaller
# The attention frames are ~750 px wide and shrink to half that on a phone: larger text.
ATTENTION_FONT = 14
FRAME_WIDTH = 7.5  # inches: the widest frame, at DPI the ~750 px content column of the book
COLOURS = 128  # palette size of the stored PNGs
MAX_FRAMES = 600  # about 6 MB of PNG at ~10 KB a frame
CONTROL_WIDTH = "280px"  # preferred width of a control: two to a row of the column, one on a phone
CONTROL_MAX_WIDTH = "420px"  # a control alone in its row stops growing here
KEY_OFFSET = 2  # rope_explorer draws k at position n = m + KEY_OFFSET
ROPE_FRAME = (FRAME_WIDTH / 2 - 0.05, 3.8)  # inches: rope_explorer's two pictures side by side


def _png(canvas: FigureCanvasAgg) -> bytes:
    """The canvas's current pixels as palette PNG bytes."""
    rgba = np.asarray(canvas.buffer_rgba())  # (height, width, 4)
    image = PILImage.fromarray(rgba).convert("RGB").quantize(COLOURS, PILImage.Quantize.FASTOCTREE)
    buffer = io.BytesIO()
    image.save(buffer, format="png", optimize=True)
    return buffer.getvalue()


def _render_frames(fig: Figure, n_frames: int, draw_frame: Callable[[int], list[Artist]]) -> list[bytes]:
    """Render ``n_frames`` PNGs of ``fig``: its static artists once, then, for frame k, the
    artists returned by ``draw_frame(k)`` on a fresh copy of that background. Artists that
    change must be created with ``animated=True`` (or, like a title, be blank at first)."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()  # the first draw settles the constrained layout ...
    fig.set_layout_engine("none")  # ... which is then frozen, so all frames share it
    canvas.draw()
    background = canvas.copy_from_bbox(fig.bbox)
    frames = []
    for k in range(n_frames):
        canvas.restore_region(background)
        for artist in draw_frame(k):
            fig.draw_artist(artist)
        frames.append(_png(canvas))
    return frames


def _png_width(png: bytes) -> int:
    """The width in pixels of a PNG, from its header (the IHDR chunk comes first)."""
    return int.from_bytes(png[16:20], "big")


def _picture_layout(width: int) -> widgets.Layout:
    """The layout of a picture ``width`` pixels wide: the container's width, at most its own."""
    return widgets.Layout(width="100%", max_width=f"{width}px", height="auto")


def _linked_stack(frames: list, controls: Sequence[tuple[widgets.Widget, str]],
                  layouts: tuple[widgets.Layout, widgets.Layout] | None = None
                  ) -> tuple[widgets.Stack, list]:
    """Nest Stacks over PNG frames and jslink each control to every Stack of its level.

    ``frames`` nests ``len(controls)`` lists deep; ``frames[i0][i1]...`` is shown when the
    integer trait of ``controls[0] = (widget, trait)`` is i0, that of ``controls[1]`` is i1, ...
    All frames share one Layout (:func:`_picture_layout` of the first frame's width) and all
    Stacks another (the full width): two models in the page's widget state, not one each.
    Returns ``(outer stack, links)``, one ``jslink`` Link per Stack.
    """
    if layouts is None:
        first = frames
        while isinstance(first, list):
            first = first[0]
        layouts = (_picture_layout(_png_width(first)), widgets.Layout(width="100%"))
    (widget, trait), inner = controls[0], controls[1:]
    children, links = [], []
    for child in frames:
        if inner:
            stack, child_links = _linked_stack(child, inner, layouts)
            children.append(stack)
            links += child_links
        else:
            children.append(widgets.Image(value=child, format="png", layout=layouts[0]))
    stack = widgets.Stack(children, selected_index=getattr(widget, trait), layout=layouts[1])
    links.append(widgets.jslink((widget, trait), (stack, "selected_index")))
    return stack, links


def _kernel_picture(frames: list, controls: Sequence[tuple[widgets.Widget, str]]
                    ) -> tuple[widgets.Image, list]:
    """Without ``Stack``: one Image showing ``frames[i0][i1]...`` for the controls' current
    integer traits, updated by a kernel callback whenever one of them moves. Returns
    ``(image, [])``: no browser-side links."""

    def current() -> bytes:
        frame = frames
        for widget, trait in controls:
            frame = frame[getattr(widget, trait)]
        return frame

    image = widgets.Image(value=current(), format="png",
                          layout=_picture_layout(_png_width(current())))

    def update(_change=None) -> None:
        image.value = current()

    for widget, trait in controls:
        widget.observe(update, names=trait)
    return image, []


def _linked_pictures(frames: list, controls: Sequence[tuple[widgets.Widget, str]]
                     ) -> tuple[widgets.Widget, list]:
    """The pictures of an explorer: nested Stacks linked in the browser where ipywidgets has
    ``Stack`` (they work without a kernel), else one Image updated by the kernel."""
    if HAS_STACK:
        return _linked_stack(frames, controls)
    return _kernel_picture(frames, controls)


def _control_row(*controls: widgets.Widget) -> widgets.Box:
    """Controls side by side while they fit, each on its own full-width row on a narrow screen."""
    for control in controls:
        control.layout = widgets.Layout(flex=f"1 1 {CONTROL_WIDTH}", width="auto", min_width="0",
                                        max_width=CONTROL_MAX_WIDTH)
    return widgets.Box(list(controls), layout=widgets.Layout(
        display="flex", flex_flow="row wrap", align_items="center", width="100%"))


def _labels(ax, xlabel: str, ylabel: str, size: int = FONT) -> None:
    """Axis labels, and a blank two-line title that reserves room for the frame titles."""
    ax.set_xlabel(xlabel, fontsize=size)
    ax.set_ylabel(ylabel, fontsize=size)
    ax.tick_params(labelsize=size - 1)
    ax.set_title("\n", fontsize=size)


def _check_frames(name: str, sizes: dict[str, int]) -> None:
    total = int(np.prod(list(sizes.values())))
    if total > MAX_FRAMES:
        counts = " × ".join(f"{v} {k}" for k, v in sizes.items())
        raise ValueError(f"{name} would render {counts} = {total} frames; keep it <= {MAX_FRAMES}")


# Attention explorer ------------------------------------------------------------------------


def _attention_frames(weights: Tensor, src: Sequence[int], out: Sequence[int], layer: int, head: int,
                      *, steps: bool = True) -> list[bytes]:
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
    frame = ax.add_patch(Rectangle((-0.5, 0), S, 1, fill=False, edgecolor="orange", linewidth=2.5,
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
                     f"looks at x[{picks[t]}]={src[picks[t]]}, mirror x[{mirror[t]}]={src[mirror[t]]}",
                     fontsize=ATTENTION_FONT)
        return [shade, frame, ax.title]

    return _render_frames(fig, T + 1 if steps else 1, draw)


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
        text = live["text"].value.strip()
        V = model.tgt_vocab_size
        try:
            parts = text.replace(",", " ").split() if (" " in text or "," in text) else list(text)
            tokens = [int(p) for p in parts]
            if not tokens or len(tokens) + 1 > model.max_len or not all(1 <= x < V for x in tokens):
                raise ValueError
        except ValueError:
            live["status"].value = (f"Type 1 to {model.max_len - 1} symbols, each in 1..{V - 1} "
                                    f"(digits, or numbers separated by spaces); got {text!r}.")
            return
        seq = torch.tensor([tokens])  # (1, S)
        seq_out, seq_weights = decode_with_cross_attention(model, seq)  # (1, 1 + S), (L, 1, H, S, S)
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
    accordion.set_title(0, "Live: your own sequence (needs a kernel)")  # ipywidgets 7 ignores titles=
    return accordion, live, render_live


def attention_explorer(model: EncoderDecoder | None = None, *, n_examples: int = 3, seq_len: int = 8,
                       seed: int = 0) -> widgets.VBox:
    """Explore the cross-attention maps of a sequence-reversal model, with or without a kernel.

    Args:
        model: a trained reversal model (:func:`transformer_lib.tasks.train_reversal`); None
            trains one with its defaults.
        n_examples: number of random source sequences to show.
        seq_len: length of the source sequences (and of the decoded output).
        seed: seeds the source sequences.

    Returns:
        A VBox with controls example, layer, head and step (an index; "all" first) over
        ``n_examples × L × H × (seq_len + 1)`` precomputed frames, and a collapsed live
        extra. Attributes for tests: ``controls`` (name -> widget), ``stack`` (the nested
        Stacks, or the one Image without ``Stack``), ``links``, ``live`` (name -> widget) and
        ``render_live`` (the live callback).
    """
    if n_examples < 1 or seq_len < 1:
        raise ValueError(f"n_examples ({n_examples}) and seq_len ({seq_len}) must be >= 1")
    if model is None:
        model, _ = train_reversal()
    if not isinstance(model, EncoderDecoder):
        raise ValueError(f"model must be an EncoderDecoder, got {type(model).__name__}")
    if seq_len + 1 > model.max_len:
        raise ValueError(f"seq_len ({seq_len}) must be < the model's max_len ({model.max_len})")
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
        "example": widgets.IntSlider(0, min=0, max=n_examples - 1, description="example", style=style),
        "layer": widgets.IntSlider(0, min=0, max=L - 1, description="layer", style=style),
        "head": widgets.IntSlider(0, min=0, max=H - 1, description="head", style=style),
        "step": widgets.SelectionSlider(options=["all"] + [str(t) for t in range(seq_len)],
                                        description="step", style=style),
    }
    stack, links = _linked_pictures(frames, [(controls["example"], "value"),
                                             (controls["layer"], "value"),
                                             (controls["head"], "value"), (controls["step"], "index")])
    caption = widgets.HTML(
        "<b>Cross-attention of the reversal model.</b> Rows: decoder inputs (BOS, then its own "
        "outputs); columns: source tokens; red boxes: the mirrored diagonal that reversal needs "
        "(step t copies source position S−1−t). Pick a step to frame its row: later rows are "
        "dimmed because the decoder has not produced them yet. All pictures are precomputed.")

    accordion, live, render_live = _live_extra(model, controls["layer"], controls["head"])
    box = widgets.VBox([caption, _control_row(*controls.values()), stack, accordion])
    box.controls, box.stack, box.links, box.live, box.render_live = controls, stack, links, live, render_live
    return box


# RoPE explorer -----------------------------------------------------------------------------


def _rope_rotated(x: Tensor, n_positions: int, theta: float, pairing: str) -> Tensor:
    """``x`` ``(D,)`` placed at positions 0 … n_positions-1 and rotated by RoPE: ``(P, D)``."""
    cos, sin = rope_cos_sin(n_positions, x.shape[-1], theta)  # (P, D/2) each
    return apply_rope(x.expand(n_positions, -1), cos, sin, pairing)  # (P, D)


def _rope_score_table(q: Tensor, k: Tensor, theta: float, n_positions: int, pairing: str) -> Tensor:
    """Scores ``table[m, n] = q_mᵀ k_n`` of fixed vectors q, k ``(D,)`` rotated to positions m, n.

    Returns:
        ``(P, P)``; it depends on n − m only, so row m against n − m is the same curve for every m.
    """
    q_rot = _rope_rotated(q, n_positions, theta, pairing)  # (P, D)
    k_rot = _rope_rotated(k, n_positions, theta, pairing)  # (P, D)
    return q_rot @ k_rot.T  # (P, P)


def _rope_pair_frames(q: Tensor, k: Tensor, i: int, theta: float, n_positions: int, pairing: str) -> list[bytes]:
    """Frames m = 0 … P-1 of channel pair i: q rotated to position m, k to n = m + KEY_OFFSET."""
    a, b = (i, i + q.shape[-1] // 2) if pairing == "half" else (2 * i, 2 * i + 1)
    n_pos = n_positions + KEY_OFFSET
    q2 = _rope_rotated(q, n_pos, theta, pairing)[:, [a, b]].numpy()  # (P + offset, 2)
    k2 = _rope_rotated(k, n_pos, theta, pairing)[:, [a, b]].numpy()  # (P + offset, 2)
    theta_i = theta ** (-2 * i / q.shape[-1])
    radius = 1.25 * max(np.linalg.norm(q2[0]), np.linalg.norm(k2[0]))
    fig = Figure(figsize=ROPE_FRAME, dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    for v, colour in ((q2[0], "tab:blue"), (k2[0], "tab:red")):
        ax.add_patch(Circle((0, 0), np.linalg.norm(v), fill=False, linestyle=":", color=colour, alpha=0.5))
    ax.axhline(0, color="lightgrey", linewidth=0.8)
    ax.axvline(0, color="lightgrey", linewidth=0.8)
    ax.set(xlim=(-radius, radius), ylim=(-radius, radius), aspect="equal")
    _labels(ax, f"channel {a}", f"channel {b}")
    arrows = [ax.add_patch(FancyArrowPatch((0, 0), (0, 0), arrowstyle="-|>", mutation_scale=12,
                                           color=colour, linewidth=2, animated=True))
              for colour in ("tab:blue", "tab:red")]

    def draw(m: int) -> list[Artist]:
        n = m + KEY_OFFSET
        arrows[0].set_positions((0, 0), tuple(q2[m]))
        arrows[1].set_positions((0, 0), tuple(k2[n]))
        ax.set_title(f"pair {i}: {theta_i:.3g} rad per position\n"
                     f"m = {m}, n = {n}: q·k here {float(q2[m] @ k2[n]):+.3f}", fontsize=FONT)
        return [*arrows, ax.title]

    return _render_frames(fig, n_positions, draw)


def _rope_score_frames(q: Tensor, k: Tensor, theta: float, n_positions: int, pairing: str) -> list[bytes]:
    """Frames m = 0 … P-1: the score q_mᵀ k_n against n − m, every other m faint behind it."""
    table = _rope_score_table(q, k, theta, n_positions, pairing).numpy()  # (P, P)
    positions = np.arange(n_positions)
    fig = Figure(figsize=ROPE_FRAME, dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    for m in positions:
        ax.plot(positions - m, table[m], color="grey", alpha=0.35, linewidth=1)
    ax.axvline(KEY_OFFSET, color="tab:red", linestyle=":", linewidth=1)
    _labels(ax, "offset n − m", r"score $q_m^\top k_n$")
    (curve,) = ax.plot([], [], color="tab:blue", marker="o", markersize=3, linewidth=2, animated=True)

    def draw(m: int) -> list[Artist]:
        curve.set_data(positions - m, table[m])
        ax.set_title(f"all {q.shape[-1]} channels, {pairing}, m = {m}\n"
                     f"grey: every other m", fontsize=FONT)
        return [curve, ax.title]

    return _render_frames(fig, n_positions, draw)


def rope_explorer(*, head_dim: int = 16, theta: float = 10000.0, n_positions: int = 16,
                  seed: int = 0) -> widgets.VBox:
    """Explore rotary position embeddings (RoPE), with or without a kernel.

    Args:
        head_dim: channels of the fixed random q and k, even.
        theta: RoPE base; pair i turns by θ_i = theta^(-2i/head_dim) radians per position.
        n_positions: positions m = 0 … n_positions-1 to choose from.
        seed: seeds q and k.

    Returns:
        A VBox with controls position m, pair i and pairing (index into ``PAIRINGS``): left,
        pair i of q at m and k at m + KEY_OFFSET (``2 × P × D/2`` frames); right, the full score
        against n − m (``2 × P`` frames). Attributes for tests: ``controls``, ``stacks``
        (``{"pair": …, "score": …}``), ``links``, ``q``, ``k``.
    """
    if head_dim < 2 or head_dim % 2 != 0:
        raise ValueError(f"head_dim must be even and >= 2, got {head_dim}")
    if n_positions < 2:
        raise ValueError(f"n_positions must be >= 2, got {n_positions}")
    if theta <= 1.0:
        raise ValueError(f"theta must be > 1, got {theta}")
    _check_frames("rope_explorer", {"pairings": len(PAIRINGS), "positions": n_positions,
                                    "pairs": head_dim // 2})
    q, k = torch.randn(2, head_dim, generator=torch.Generator().manual_seed(seed))  # (D,) each
    by_pair = [[_rope_pair_frames(q, k, i, theta, n_positions, pairing) for i in range(head_dim // 2)]
               for pairing in PAIRINGS]  # [pairing][i][m]
    pair_frames = [[list(ms) for ms in zip(*frames)] for frames in by_pair]  # [pairing][m][i]
    score_frames = [_rope_score_frames(q, k, theta, n_positions, pairing) for pairing in PAIRINGS]

    style = {"description_width": "80px"}
    controls = {
        "m": widgets.IntSlider(0, min=0, max=n_positions - 1, description="position m", style=style),
        "i": widgets.IntSlider(0, min=0, max=head_dim // 2 - 1, description="pair i", style=style),
        # A Dropdown rather than ToggleButtons: a <select> moves with the arrow keys.
        "pairing": widgets.Dropdown(options=[(name, p) for p, name in enumerate(PAIRINGS)],
                                    description="pairing", style=style),
    }
    pair_stack, pair_links = _linked_pictures(
        pair_frames, [(controls["pairing"], "index"), (controls["m"], "value"), (controls["i"], "value")])
    score_stack, score_links = _linked_pictures(
        score_frames, [(controls["pairing"], "index"), (controls["m"], "value")])
    caption = widgets.HTML(
        f"<b>RoPE turns each channel pair by an angle proportional to the position.</b> Left: "
        f"channel pair i of a fixed random query q at position m (blue) and key k at position "
        f"n = m + {KEY_OFFSET} (red). Move m: both turn by the same angle, so their dot product "
        f"in this pair never changes. \"half\" pairs channel i with i + {head_dim // 2}, "
        f"\"interleaved\" 2i with 2i+1. Right: the full score q<sub>m</sub>ᵀk<sub>n</sub> over "
        f"all {head_dim} channels against the offset n − m; the curves of every other m "
        f"(grey) lie on it: the score depends on n − m only. Dotted red: n − m = {KEY_OFFSET}.")
    for picture in (pair_stack, score_stack):  # side by side; one above the other on a phone
        picture.layout = widgets.Layout(flex="1 1 300px", min_width="0")
    pictures = widgets.Box([pair_stack, score_stack], layout=widgets.Layout(
        display="flex", flex_flow="row wrap", justify_content="center", width="100%"))
    box = widgets.VBox([caption, _control_row(*controls.values()), pictures])
    box.controls, box.stacks = controls, {"pair": pair_stack, "score": score_stack}
    box.links, box.q, box.k = pair_links + score_links, q, k
    return box
