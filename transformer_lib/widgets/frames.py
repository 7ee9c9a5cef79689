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
with the fonts and colours of :mod:`transformer_lib.plotting.style`. A phone shows the column
about ``PHONE_COLUMN`` (358) CSS px wide, where such a frame's text would shrink to 7-8 px: so
each picture whose frames are wider than a phone also has a narrow set, drawn by the same
callback with ``narrow=True`` (``NARROW_WIDTH`` inches, text of ``NARROW_FONT`` points, side
by side panels one above the other), in a second nest of Stacks driven by the same controls
(``_picture_sets``). The wide set carries the class ``WIDE_CLASS``, the narrow one
``NARROW_CLASS`` and is hidden by its own style; the book's stylesheet shows the narrow set
instead where the explorer (class ``EXPLORER_CLASS``, a CSS size container) is at most 540 px
wide. Jupyter shows the wide set; the kernel path (no ``Stack``) has the wide set only. Every
picture knows the smallest text of its frames, in pixels at its natural size (``text_px``),
measured while they are drawn (``_render_frames``): the tests hold it to
``PHONE_TEXT_PX`` at a phone's column.

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
NARROW_WIDTH = 3.6  #: inches: the narrow frames, at DPI about a 390 px phone's column
NARROW_FONT = 10  #: points: titles and labels of narrow frames; ticks and legends 9
EXPLORER_CLASS = "explorer"  #: the CSS class of an explorer's box (a CSS size container)
WIDE_CLASS = "explorer-wide"  #: the CSS class of a picture's wide set of frames
NARROW_CLASS = "explorer-narrow"  #: the CSS class of a picture's narrow set (phones)


class Explorer(widgets.VBox):
    """What an explorer function returns: the widget a notebook shows (a VBox: caption,
    controls, pictures), with its parts named.

    Attributes:
        controls: name -> control (a slider or a dropdown), in the order shown.
        pictures: name -> picture: nested Stacks of frames, or one Image (HTML for text
            frames) updated by the kernel where ipywidgets has no ``Stack``. A picture of PNG
            frames has ``text_px``, the smallest text of its frames in pixels at their size.
        narrow: name -> the narrow set of that picture (nested Stacks, shown instead of the
            picture on a phone), for the pictures that have one; empty without ``Stack``.
        links: the ``jslink`` Links that drive the Stacks from the controls (none without
            ``Stack``).
    """

    controls: dict[str, widgets.Widget]
    pictures: dict[str, widgets.Widget]
    narrow: dict[str, widgets.Widget]
    links: list[widgets.Widget]

    def __init__(self, children: Sequence[widgets.Widget], *,
                 controls: Mapping[str, widgets.Widget], pictures: Mapping[str, widgets.Widget],
                 links: Sequence[widgets.Widget],
                 narrow: Mapping[str, widgets.Widget] | None = None) -> None:
        super().__init__(list(children))
        self.controls, self.pictures, self.links = dict(controls), dict(pictures), list(links)
        self.narrow = {name: n for name, n in (narrow or {}).items() if n is not None}
        self.add_class(EXPLORER_CLASS)


class Frames(list):
    """The PNG frames of one figure (a list of bytes), with ``text_px``: the size of the
    smallest text drawn on them, in pixels at the frames' own size."""

    def __init__(self, frames: Sequence[bytes] = (), text_px: float = float("inf")) -> None:
        super().__init__(frames)
        self.text_px = text_px


def _png(canvas: FigureCanvasAgg) -> bytes:
    """The canvas's current pixels as palette PNG bytes."""
    rgba = np.asarray(canvas.buffer_rgba())  # (height, width, 4)
    image = PILImage.fromarray(rgba).convert("RGB").quantize(COLOURS, PILImage.Quantize.FASTOCTREE)
    buffer = io.BytesIO()
    image.save(buffer, format="png", optimize=True)
    return buffer.getvalue()


def _render_frames(fig: Figure, n_frames: int,
                   draw_frame: Callable[[int], list[Artist]]) -> Frames:
    """Render ``n_frames`` PNGs of ``fig``: its static artists once, then, for frame k, the
    artists returned by ``draw_frame(k)`` on a fresh copy of that background. Artists that
    change must be created with ``animated=True`` (or, like a title, be blank at first).

    The renderer notes the size of every piece of text it draws (static or in a frame, ticks,
    legends and formulas too; blank ones aside): the smallest, in pixels at ``fig``'s DPI, is
    the result's ``text_px``."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()  # the first draw settles the constrained layout ...
    fig.set_layout_engine("none")  # ... which is then frozen, so all frames share it
    renderer = canvas.get_renderer()  # the one every later draw reuses (same size)
    sizes: list[float] = []
    draw_text = renderer.draw_text

    def noting_draw_text(gc, x, y, s, prop, angle, *args, **kwargs):
        if str(s).strip():
            sizes.append(prop.get_size_in_points())
        return draw_text(gc, x, y, s, prop, angle, *args, **kwargs)

    renderer.draw_text = noting_draw_text
    try:
        canvas.draw()
        background = canvas.copy_from_bbox(fig.bbox)
        frames = Frames()
        for k in range(n_frames):
            canvas.restore_region(background)
            for artist in draw_frame(k):
                fig.draw_artist(artist)
            frames.append(_png(canvas))
    finally:
        del renderer.draw_text  # the class's method again
    frames.text_px = min(sizes, default=float("inf")) * fig.dpi / 72
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


def _smallest_text_px(frames: list) -> float:
    """The smallest ``text_px`` of the :class:`Frames` in nested lists (inf if none)."""
    if isinstance(frames, Frames):
        return frames.text_px
    if isinstance(frames, list):
        return min((_smallest_text_px(f) for f in frames), default=float("inf"))
    return float("inf")


def _linked_pictures(frames: list, controls: Sequence[tuple[widgets.Widget, str]]
                     ) -> tuple[widgets.Widget, list]:
    """The pictures of an explorer: nested Stacks linked in the browser where ipywidgets has
    ``Stack`` (they work without a kernel), else one Image (or HTML) updated by the kernel.
    PNG frames give the picture a ``text_px`` (:class:`Frames`)."""
    picture, links = (_linked_stack if HAS_STACK else _kernel_picture)(frames, controls)
    if not isinstance(_first(frames), str):
        picture.text_px = _smallest_text_px(frames)
    return picture, links


def _picture_sets(render: Callable[[bool], list],
                  controls: Sequence[tuple[widgets.Widget, str]]
                  ) -> tuple[widgets.Widget, widgets.Widget | None, list]:
    """A picture in two sets of frames, ``render(False)`` (wide) and ``render(True)``
    (narrow, for phones), both driven by ``controls`` (see :func:`_linked_pictures`).

    Returns ``(wide, narrow, links)``. The wide set has the class ``WIDE_CLASS``; the narrow
    one ``NARROW_CLASS`` and its own style ``display: none``, which the book's stylesheet
    overrides in a narrow explorer (and hides the wide set). Without ``Stack`` (the kernel
    path) ``narrow`` is None: only the wide set is rendered.
    """
    wide, links = _linked_pictures(render(False), controls)
    if not HAS_STACK:
        return wide, None, links
    narrow, narrow_links = _linked_pictures(render(True), controls)
    wide.add_class(WIDE_CLASS)
    narrow.add_class(NARROW_CLASS)
    narrow.layout = widgets.Layout(width="100%", display="none")  # its nested Stacks keep theirs
    return wide, narrow, links + narrow_links


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
