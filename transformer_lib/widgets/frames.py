"""The machinery every explorer shares: frames rendered once to PNG, pictures that show the
frame the controls select (in the browser, or through the kernel), rows of controls that wrap,
and :class:`Explorer`, the widget an explorer function returns.

A picture drawn by a Python callback (``interact``, ``interactive_output``) never updates
on a page without a kernel. So every combination of the controls is rendered once to a small
PNG; the PNGs are ``widgets.Image`` leaves of nested ``widgets.Stack`` s (one level per
control) and each control drives its level's ``selected_index`` through ``widgets.jslink``,
which runs in the browser: the book's embedded widget state is enough. Controls are integer
indices: ``IntSlider(min=0)``, or a selection widget linked by ``index`` (its ``value`` is
not synced to the browser). Frames are drawn on bare ``Figure`` s with the Agg canvas (pyplot
and its backend are never touched), the static part once per figure (blitting), and stored
as palette PNGs.

With a kernel whose ipywidgets has no ``Stack`` (ipywidgets 7, which Colab ships), the same
explorers show one ``Image`` and update it in the kernel: moving a control sets the picture
from the same precomputed frames (an ``observe`` callback), and only ipywidgets 7 core
controls are used. The path is chosen by capability (``HAS_STACK``), not by guessing the
host.

Frames are drawn at most ``FRAME_WIDTH`` inches wide at ``DPI``, the book's content column,
with the fonts and colours of :mod:`transformer_lib.plotting.style`.

A frame may also be text: a ``str`` of HTML (numbers, a table, bars made of ``div`` s), for
explorers whose hundreds of combinations are numbers rather than pictures. Its leaves are
``widgets.HTML`` (class ``FRAME_CLASS``, so that a page can tell them from captions), in the
same Stacks, or one HTML updated by the kernel where there is no ``Stack``.
"""
from __future__ import annotations

import io
from typing import Callable, Mapping, Sequence

import ipywidgets as widgets
import numpy as np
from matplotlib.artist import Artist
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from PIL import Image as PILImage

from transformer_lib.plotting.style import MAX_WIDTH, TITLE_SIZE

#: ipywidgets 8 has Stack (the static book's path); ipywidgets 7 (Colab) does not: there the
#: pictures update through the kernel instead.
HAS_STACK = hasattr(widgets, "Stack")
FONT = TITLE_SIZE  #: titles and axis labels inside frames; tick labels one point smaller
FRAME_WIDTH = MAX_WIDTH  #: inches: the widest frame, at DPI the ~750 px content column
COLOURS = 128  #: palette size of the stored PNGs
MAX_FRAMES = 600  #: about 6 MB of PNG at ~10 KB a frame
CONTROL_WIDTH = "280px"  #: preferred width of a control: two to a row of the column, one on a phone
CONTROL_MAX_WIDTH = "420px"  #: a control alone in its row stops growing here
FRAME_CLASS = "explorer-frame"  #: the CSS class of every HTML frame (text frames)


class Explorer(widgets.VBox):
    """What an explorer function returns: the widget a notebook shows (a VBox: caption,
    controls, pictures), with its parts named.

    Attributes:
        controls: name -> control (a slider or a dropdown), in the order shown.
        pictures: name -> picture: nested Stacks of frames, or one Image (HTML for text
            frames) updated by the kernel where ipywidgets has no ``Stack``.
        links: the ``jslink`` Links that drive the Stacks from the controls (none without
            ``Stack``).
    """

    controls: dict[str, widgets.Widget]
    pictures: dict[str, widgets.Widget]
    links: list[widgets.Widget]

    def __init__(self, children: Sequence[widgets.Widget], *,
                 controls: Mapping[str, widgets.Widget], pictures: Mapping[str, widgets.Widget],
                 links: Sequence[widgets.Widget]) -> None:
        super().__init__(list(children))
        self.controls, self.pictures, self.links = dict(controls), dict(pictures), list(links)


def _png(canvas: FigureCanvasAgg) -> bytes:
    """The canvas's current pixels as palette PNG bytes."""
    rgba = np.asarray(canvas.buffer_rgba())  # (height, width, 4)
    image = PILImage.fromarray(rgba).convert("RGB").quantize(COLOURS, PILImage.Quantize.FASTOCTREE)
    buffer = io.BytesIO()
    image.save(buffer, format="png", optimize=True)
    return buffer.getvalue()


def _render_frames(fig: Figure, n_frames: int,
                   draw_frame: Callable[[int], list[Artist]]) -> list[bytes]:
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


def _first(frames: list) -> bytes | str:
    """The first frame of nested lists of frames."""
    while isinstance(frames, list):
        frames = frames[0]
    return frames


def _leaf_maker(first: bytes | str) -> Callable[[bytes | str], widgets.Widget]:
    """A function that makes the leaf showing one frame: an ``Image`` for PNG bytes, an
    ``HTML`` of class ``FRAME_CLASS`` for a string. All leaves it makes share one Layout (and
    the HTML leaves one style): one model each in the page's widget state, not one a frame."""
    if isinstance(first, str):
        shared = {"layout": widgets.Layout(width="100%")}

        def html(frame: str) -> widgets.HTML:
            leaf = widgets.HTML(value=frame, **shared)
            shared["style"] = leaf.style  # every later leaf shares the first one's style
            leaf.add_class(FRAME_CLASS)
            return leaf
        return html
    layout = _picture_layout(_png_width(first))
    return lambda frame: widgets.Image(value=frame, format="png", layout=layout)


def _linked_stack(frames: list, controls: Sequence[tuple[widgets.Widget, str]],
                  parts: tuple[Callable, widgets.Layout] | None = None
                  ) -> tuple[widgets.Stack, list]:
    """Nest Stacks over frames (PNG bytes or HTML strings) and jslink each control to every
    Stack of its level.

    ``frames`` nests ``len(controls)`` lists deep; ``frames[i0][i1]...`` is shown when the
    integer trait of ``controls[0] = (widget, trait)`` is i0, that of ``controls[1]`` is i1, ...
    All frames share one Layout (for pictures :func:`_picture_layout` of the first frame's
    width) and all Stacks another (the full width): two models in the page's widget state,
    not one each. Returns ``(outer stack, links)``, one ``jslink`` Link per Stack.
    """
    if parts is None:
        parts = (_leaf_maker(_first(frames)), widgets.Layout(width="100%"))
    (widget, trait), inner = controls[0], controls[1:]
    children, links = [], []
    for child in frames:
        if inner:
            stack, child_links = _linked_stack(child, inner, parts)
            children.append(stack)
            links += child_links
        else:
            children.append(parts[0](child))
    stack = widgets.Stack(children, selected_index=getattr(widget, trait), layout=parts[1])
    links.append(widgets.jslink((widget, trait), (stack, "selected_index")))
    return stack, links


def _kernel_picture(frames: list, controls: Sequence[tuple[widgets.Widget, str]]
                    ) -> tuple[widgets.Widget, list]:
    """Without ``Stack``: one Image (or HTML, for text frames) showing ``frames[i0][i1]...``
    for the controls' current integer traits, updated by a kernel callback whenever one of
    them moves. Returns ``(picture, [])``: no browser-side links."""

    def current() -> bytes | str:
        frame = frames
        for widget, trait in controls:
            frame = frame[getattr(widget, trait)]
        return frame

    image = _leaf_maker(current())(current())

    def update(_change=None) -> None:
        image.value = current()

    for widget, trait in controls:
        widget.observe(update, names=trait)
    return image, []


def _linked_pictures(frames: list, controls: Sequence[tuple[widgets.Widget, str]]
                     ) -> tuple[widgets.Widget, list]:
    """The pictures of an explorer: nested Stacks linked in the browser where ipywidgets has
    ``Stack`` (they work without a kernel), else one Image (or HTML) updated by the kernel."""
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
    """Raise a ValueError if the explorer ``name`` would render more than ``MAX_FRAMES``
    frames, ``sizes`` being the number of choices of each control."""
    total = int(np.prod(list(sizes.values())))
    if total > MAX_FRAMES:
        counts = " × ".join(f"{v} {k}" for k, v in sizes.items())
        raise ValueError(f"{name} would render {counts} = {total} frames; keep it <= {MAX_FRAMES}")
