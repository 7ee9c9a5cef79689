"""The heads explorer (chapter 3): what each head of a trained attention layer reads as the
number of heads changes at a fixed width.

The layer is chapter 3's two-reads model (one ``MultiHeadAttention`` of width 32 and two
read-outs at the query: the value stored under the query's key, and the value stored just
before the query), trained with 1, 2, 4 and 8 heads by ``bench/two_reads_heads.py``. Its
results are bundled (``TWO_READS_HEADS_FILE``), so the explorer trains nothing and draws in a
second; every frame is rendered in advance, so it works in the static book.
"""
from __future__ import annotations

from typing import Callable, Mapping, Sequence

import ipywidgets as widgets
import numpy as np
from matplotlib import patheffects
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from transformer_lib.plotting.style import BLUE, DPI, VERMILLION, WEIGHT_CMAP
from transformer_lib.resources import load_json
from transformer_lib.widgets.frames import (
    FRAME_WIDTH,
    NARROW_FONT,
    NARROW_WIDTH,
    Explorer,
    _check_frames,
    _control_row,
    _linked_pictures,
    _picture_sets,
    _render_frames,
)

TWO_READS_HEADS_FILE = "two_reads_heads.json"  #: written by bench/two_reads_heads.py
HEADS_FRAME = (FRAME_WIDTH, 4.8)  #: the frame's (width, height) in inches
HEADS_NARROW_FRAME = (NARROW_WIDTH, 6.6)  #: inches: the heads, the keys, then the means
#: The frames are ~750 px wide and shrink to about half that on a phone: larger text.
HEADS_FONT = 14
ASKED_COLOUR, BEFORE_COLOUR = VERMILLION, BLUE  # the two reads, in every part of a frame


class HeadsExplorer(Explorer):
    """The widget :func:`heads_explorer` returns.

    Besides :class:`~transformer_lib.widgets.frames.Explorer`'s ``controls`` ``heads`` and
    ``example``, ``pictures`` ``{"heads": …}`` and ``links``, it holds:

    Attributes:
        data: the bundled results it draws (see ``load_two_reads_heads``).
        alt: ``alt[i][e]``: the text alternative of the frame for the i-th head count and
            example e, shown in words under the picture (``pictures["text"]``).
    """

    data: dict
    alt: list[list[str]]

    def __init__(self, children: Sequence[widgets.Widget], *, data: dict,
                 alt: list[list[str]], **parts) -> None:
        super().__init__(children, **parts)
        self.data, self.alt = data, alt


def load_two_reads_heads() -> dict:
    """The bundled results of ``bench/two_reads_heads.py``: ``settings``, ``examples``
    (``keys``, ``values`` ``(n, T)``, ``asked``, ``match``, ``prev`` ``(n,)``) and one entry
    of ``results`` per head count H (``accuracy``, ``on_match`` and ``on_prev`` ``(H,)``,
    ``weights`` ``(n, H, T)`` at the query, ``predicted``)."""
    return load_json(TWO_READS_HEADS_FILE)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _verdict(answer: int, truth: int) -> str:
    return f"{answer} (right)" if answer == truth else f"{answer} (wrong, not {truth})"


def _heads_frames(result: Mapping, examples: Mapping, n_examples: int,
                  width: int, narrow: bool = False) -> list[bytes]:
    """Frames e = 0 … n_examples-1 of the layer with ``result["n_heads"]`` heads (one entry
    of the bundled ``results``) on the bundled ``examples``, for a layer ``width`` wide: see
    :func:`_heads_figure`."""
    fig, _, draw = _heads_figure(result, examples, width, narrow)
    return _render_frames(fig, n_examples, draw)


def _heads_figure(result: Mapping, examples: Mapping, width: int, narrow: bool = False
                  ) -> tuple[Figure, Axes, Callable[[int], list[Artist]]]:
    """The figure of the explorer's frames for one head count, its heatmap Axes and the
    function that draws example e on it. Left: each head's weights at the query of example e
    (heads × positions, the Axes returned), with the asked pair and the position before the
    query outlined and the example's keys and values below; right, each head's mean weight on
    the two over the test sequences where they differ, and the test accuracies. ``narrow``:
    for a phone, the means and accuracies below the weights and the keys."""
    H = result["n_heads"]
    T = len(examples["keys"][0])
    font = NARROW_FONT if narrow else HEADS_FONT
    if narrow:
        fig = Figure(figsize=HEADS_NARROW_FRAME, dpi=DPI, layout="constrained")
        grid = fig.add_gridspec(3, 2, height_ratios=(4, 1.6, 2.6))
        ax, ax_table = fig.add_subplot(grid[0, :]), fig.add_subplot(grid[1, :])
        ax_table.sharex(ax)
        ax_mean, ax_key = fig.add_subplot(grid[2, 0]), fig.add_subplot(grid[2, 1])
    else:
        fig = Figure(figsize=HEADS_FRAME, dpi=DPI, layout="constrained")
        grid = fig.add_gridspec(2, 2, width_ratios=(T, 3), height_ratios=(4, 1.6))
        ax, ax_mean = fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1])
        ax_table, ax_key = fig.add_subplot(grid[1, 0], sharex=ax), fig.add_subplot(grid[1, 1])
    heads = [f"head {h}" for h in range(H)]
    image = ax.imshow(np.zeros((H, T)), cmap=WEIGHT_CMAP, vmin=0, vmax=1, aspect="auto",
                      interpolation="none", animated=True)
    ax.set_yticks(range(H), labels=heads, fontsize=font)
    ax.tick_params(labelbottom=False, length=0)
    ax.set_title("\n", fontsize=font)
    means = np.array([result["on_match"], result["on_prev"]]).T  # (H, 2)
    ax_mean.imshow(means, cmap=WEIGHT_CMAP, vmin=0, vmax=1, aspect="auto",
                   interpolation="none")
    accuracy = result["accuracy"]
    ax_mean.set_xticks([0, 1], labels=["asked", "before"], fontsize=font)
    ax_mean.set_yticks(range(H), labels=[])
    ax_mean.tick_params(labelbottom=False, labeltop=True, length=0)
    for j, colour in enumerate((ASKED_COLOUR, BEFORE_COLOUR)):
        ax_mean.get_xticklabels()[j].set_color(colour)
    ax_mean.set_title("mean weight,\ntest sequences", fontsize=font)
    fig.colorbar(ax_mean.images[0], ax=ax_mean, fraction=0.12, pad=0.06).ax.tick_params(
        labelsize=font)
    ax_key.axis("off")
    ax_key.text(0, 0.5, f"test accuracy\nasked {accuracy['match']:.1%}\n"
                f"before {accuracy['prev']:.1%}", fontsize=font, va="center",
                transform=ax_key.transAxes)
    ax_table.set(ylim=(0, 3), yticks=[0.5, 1.5, 2.5])
    ax_table.set_yticklabels(["value", "key", "position"], fontsize=font)
    for t, label in enumerate([str(t) for t in range(T - 1)] + ["query"]):
        ax_table.text(t, 2.5, label, ha="center", va="center", fontsize=font,
                      color="dimgrey")
    ax_table.tick_params(labelbottom=False, length=0)
    for side in ax_table.spines.values():
        side.set_visible(False)
    halo = [patheffects.withStroke(linewidth=5, foreground="white")]
    boxes = [ax.add_patch(Rectangle((0, -0.5), 1, H, fill=False, edgecolor=colour,
                                    linewidth=2.5, linestyle=style, animated=True,
                                    path_effects=halo))
             for colour, style in ((ASKED_COLOUR, "-"), (BEFORE_COLOUR, "--"))]
    cells = [[ax_table.text(t, y, "", ha="center", va="center", fontsize=font,
                            animated=True) for t in range(T)] for y in (1.5, 0.5)]  # key, value

    def draw(e: int) -> list[Artist]:
        keys, values = examples["keys"][e], examples["values"][e]
        asked = examples["asked"][e]
        image.set_data(np.array(result["weights"][e]))  # (H, T)
        boxes[0].set_x(asked - 0.5)
        boxes[1].set_x(T - 2 - 0.5)
        for t in range(T):
            key_colour = ASKED_COLOUR if t in (asked, T - 1) else "black"
            value_colour = {asked: ASKED_COLOUR, T - 2: BEFORE_COLOUR}.get(t, "black")
            cells[0][t].set(text=str(keys[t]), color=key_colour,
                            fontweight="bold" if key_colour != "black" else "normal")
            cells[1][t].set(text="?" if t == T - 1 else str(values[t]), color=value_colour,
                            fontweight="bold" if value_colour != "black" else "normal")
        match, prev = (result["predicted"][k][e] for k in ("match", "prev"))
        ax.set_title(
            f"{_plural(H, 'head')} of width {width // H}, query key {keys[-1]}\n"
            f"answers {_verdict(match, examples['match'][e])} and "
            f"{_verdict(prev, examples['prev'][e])}", fontsize=font)
        return [image, *boxes, *cells[0], *cells[1], ax.title]

    return fig, ax, draw


def _alt_text(result: Mapping, examples: Mapping, e: int, width: int) -> str:
    """What the frame of example e shows, in words: where each head's largest weight falls."""
    H, T = result["n_heads"], len(examples["keys"][0])
    asked = examples["asked"][e]
    where = {asked: "the asked pair", T - 2: "the position before the query"}
    heads = []
    for h, row in enumerate(result["weights"][e]):
        peak = int(np.argmax(row))
        heads.append(f"head {h} puts {row[peak]:.2f} on {where.get(peak, f'position {peak}')}")
    accuracy = result["accuracy"]
    return (f"{_plural(H, 'head')} of width {width // H}, example {e}: the query repeats the "
            f"key of pair {asked}. " + "; ".join(heads) + f". On the test sequences the value "
            f"under the key is right {accuracy['match']:.1%} of the time, the value before "
            f"the query {accuracy['prev']:.1%}.")


def _check_arguments(data: Mapping, heads: Sequence[int], n_examples: int) -> None:
    """Raise a ValueError naming the bad value if ``heads`` are not among the trained head
    counts or ``n_examples`` is not between 1 and the number of stored examples."""
    trained = [r["n_heads"] for r in data["results"]]
    if not heads or any(h not in trained for h in heads) or len(set(heads)) != len(heads):
        raise ValueError(f"heads must be distinct head counts among the trained ones "
                         f"{trained}, got {list(heads)}")
    stored = len(data["examples"]["keys"])
    if not 1 <= n_examples <= stored:
        raise ValueError(f"n_examples must be between 1 and {stored} (the stored test "
                         f"sequences), got {n_examples}")
    _check_frames("heads_explorer", {"head counts": len(heads), "examples": n_examples})


def heads_explorer(*, heads: Sequence[int] | None = None,
                   n_examples: int = 6) -> HeadsExplorer:
    """Explore the heads of chapter 3's two-reads model as their number changes at the same
    width, with or without a kernel.

    Args:
        heads: the head counts to choose from, among those trained (1, 2, 4 and 8); all of
            them when None.
        n_examples: how many of the stored test sequences to choose from (at most 8).

    Returns:
        A :class:`HeadsExplorer` (a VBox, shown as the widget) with controls ``heads`` (a
        SelectionSlider whose ``index`` picks the head count) and ``example`` (an IntSlider)
        over ``len(heads) × n_examples`` precomputed frames (``pictures["heads"]``).
    """
    data = load_two_reads_heads()
    heads = [r["n_heads"] for r in data["results"]] if heads is None else list(heads)
    _check_arguments(data, heads, n_examples)
    by_heads = {r["n_heads"]: r for r in data["results"]}
    width, examples = data["settings"]["C"], data["examples"]
    n_test = data["settings"]["n_test"]
    alt = [[_alt_text(by_heads[h], examples, e, width) for e in range(n_examples)]
           for h in heads]

    style = {"description_width": "80px"}
    controls = {
        "heads": widgets.SelectionSlider(options=[(str(h), h) for h in heads],
                                         description="heads", style=style),
        "example": widgets.IntSlider(0, min=0, max=n_examples - 1, description="example",
                                     style=style),
    }
    pairs = [(controls["heads"], "index"), (controls["example"], "value")]
    picture, narrow, links = _picture_sets(
        lambda narrow: [_heads_frames(by_heads[h], examples, n_examples, width, narrow)
                        for h in heads], pairs)
    # The pictures' text alternative, in words under them (an Image has no alt attribute).
    text, text_links = _linked_pictures(alt, pairs)
    caption = widgets.HTML(
        f"<b>The heads of one trained attention layer of width {width}, cut into "
        f"{', '.join(map(str, heads[:-1]))}{' or ' if len(heads) > 1 else ''}{heads[-1]} "
        "heads.</b> Each row is one head's weights at the query over the "
        "positions (keys and values below); the title gives the layer's two answers, the "
        "value under the query's key and the value before the query. Red box: the pair "
        "whose key the query repeats "
        "(read by content); dashed blue box: the position just before the query (read by "
        f"position). Right: each head's mean weight on the two over the {n_test:,} test "
        "sequences (those where the two differ), and how often each answer is right. All "
        "pictures are precomputed.")
    return HeadsExplorer([caption, _control_row(*controls.values()),
                          widgets.VBox([p for p in (picture, narrow) if p is not None]
                                       + [text])],
                         controls=controls, pictures={"heads": picture, "text": text},
                         narrow={"heads": narrow},
                         links=links + text_links, data=data, alt=alt)
