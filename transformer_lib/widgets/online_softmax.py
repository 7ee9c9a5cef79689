"""The online-softmax explorer (chapter 8): one query's row of scores read one tile of keys at
a time, with the running maximum m, the running sum ℓ, the rescale factor and the partial
output a / ℓ converging on the exact softmax output.

The numbers come from an fp64 online softmax written out here (``_online_softmax_steps``);
every frame is rendered in advance, so the explorer works in the static book.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import ipywidgets as widgets
import numpy as np
from matplotlib.artist import Artist
from matplotlib.figure import Figure

from transformer_lib.plotting.style import BLACK, BLUE, DPI, GREY, ORANGE
from transformer_lib.widgets.frames import (
    FONT,
    NARROW_FONT,
    NARROW_WIDTH,
    Explorer,
    _check_frames,
    _control_row,
    _picture_sets,
    _render_frames,
)

ONLINE_FRAME = (6.0, 6.4)  #: inches: three panels, one above the other
ONLINE_NARROW_FRAME = (NARROW_WIDTH, 7.4)  #: inches: the same on a phone, titles on two lines
UNSEEN = "#d9d9d9"  #: the keys not read yet
OPENING_STEP = 2  #: the explorer opens on this many tiles read (step 0 has nothing to show)


class OnlineSteps(NamedTuple):
    """The state of the online softmax after each step, step 0 being before any key is read.

    Each field is an array ``(n_tiles + 1,)``, float64 except ``end``.
    """

    end: np.ndarray  #: keys read so far (the step's tile ends before key ``end``)
    m: np.ndarray  #: running maximum of the scores read (−inf at step 0)
    l: np.ndarray  #: running sum of exp(s_j − m) over the keys read
    a: np.ndarray  #: running sum of exp(s_j − m) v_j over the keys read
    #: exp(m_before − m_after), the factor the old sums were multiplied by (0 on the first
    #: tile, where m_before = −inf; NaN at step 0)
    rescale: np.ndarray
    out: np.ndarray  #: the partial output a / ℓ (NaN at step 0)


class OnlineSoftmaxExplorer(Explorer):
    """The widget :func:`online_softmax_explorer` returns.

    Besides :class:`~transformer_lib.widgets.frames.Explorer`'s ``controls`` ``tile`` and
    ``step``, ``pictures`` ``{"online": …}`` and ``links``, it holds:

    Attributes:
        scores, values: the fixed row of scores and the scalar values, ``(S,)`` float64 each.
        tile_sizes: the tile sizes the ``tile`` control chooses among.
    """

    scores: np.ndarray
    values: np.ndarray
    tile_sizes: tuple[int, ...]

    def __init__(self, children: Sequence[widgets.Widget], *, scores: np.ndarray,
                 values: np.ndarray, tile_sizes: tuple[int, ...], **parts) -> None:
        super().__init__(children, **parts)
        self.scores, self.values, self.tile_sizes = scores, values, tile_sizes


def _online_softmax_steps(scores: np.ndarray, values: np.ndarray, tile: int) -> OnlineSteps:
    """Run the online softmax over ``scores`` ``(S,)`` with scalar ``values`` ``(S,)`` in
    float64, ``tile`` keys at a time, recording the state after every tile.

    Returns:
        :class:`OnlineSteps`, each field ``(ceil(S / tile) + 1,)``.
    """
    s, v = np.asarray(scores, dtype=np.float64), np.asarray(values, dtype=np.float64)
    m, l, a = -np.inf, 0.0, 0.0
    rows = [(0, m, l, a, np.nan, np.nan)]
    for start in range(0, len(s), tile):
        part = s[start:start + tile]  # (b,), b <= tile: the last tile may be short
        m_next = max(m, float(part.max()))
        rescale = float(np.exp(m - m_next))  # moves the old sums onto the new maximum
        e = np.exp(part - m_next)  # (b,): every exponent <= 0
        l = rescale * l + float(e.sum())
        a = rescale * a + float(e @ v[start:start + tile])  # (b,) @ (b,) -> scalar
        m = m_next
        rows.append((start + len(part), m, l, a, rescale, a / l))
    end, *rest = zip(*rows)
    return OnlineSteps(np.array(end), *(np.array(x, dtype=np.float64) for x in rest))


def _example_row(n_keys: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A row of scores that drifts upwards (so the running maximum rises several times) and
    scalar values: ``(S,)`` float64 each."""
    rng = np.random.default_rng(seed)
    scores = 1.2 * rng.standard_normal(n_keys) + np.linspace(0.0, 2.5, n_keys)  # (S,)
    return scores, rng.standard_normal(n_keys)  # (S,), (S,)


def _online_softmax_frames(scores: np.ndarray, values: np.ndarray, tile: int,
                           n_frames: int, narrow: bool = False) -> list[bytes]:
    """Frames k = 0 … n_frames-1: the state after k tiles of ``tile`` keys (after the last
    tile when k is larger than the number of tiles). ``narrow``: the frames for a phone
    (``NARROW_WIDTH`` wide, each title on two lines)."""
    S = len(scores)
    steps = _online_softmax_steps(scores, values, tile)
    n_tiles = len(steps.end) - 1
    e_max = np.exp(scores - scores.max())  # (S,)
    exact = float(e_max @ values / e_max.sum())  # softmax(s) · v
    keys = np.arange(S)

    size = NARROW_FONT if narrow else FONT
    cut = "\n" if narrow else "; "  # where a title breaks on a phone
    fig = Figure(figsize=ONLINE_NARROW_FRAME if narrow else ONLINE_FRAME, dpi=DPI,
                 layout="constrained")
    ax_s, ax_e, ax_o = fig.subplots(3, 1)
    for ax in (ax_s, ax_e, ax_o):
        ax.set_xlim(-1, S)
        ax.tick_params(labelsize=size - 1)
        ax.set_title("\n" if narrow else " ", fontsize=size)
        for start in range(0, S + 1, tile):  # tile boundaries
            ax.axvline(min(start, S) - 0.5, color=GREY, linewidth=0.6, alpha=0.5)
    low, high = scores.min(), scores.max()
    ax_s.set_ylim(min(0.0, low) - 0.3, high + 0.6)
    ax_s.set_ylabel("score $s_j$", fontsize=size)
    ax_s.tick_params(labelbottom=False)
    ax_e.set_ylim(0, 1.12)
    ax_e.set_ylabel("$e^{s_j - m}$", fontsize=size)
    ax_e.set_xlabel("key j (grey lines: tile boundaries)", fontsize=size)
    spread = max(abs(steps.out[1:] - exact).max(), 0.05)
    ax_o.set_ylim(exact - 1.2 * spread, exact + 1.2 * spread)
    ax_o.axhline(exact, color=BLACK, linestyle="--", linewidth=1.2)
    ax_o.text(0.01, exact, f" exact softmax output {exact:.3f}", fontsize=size - 1,
              transform=ax_o.get_yaxis_transform(), va="bottom")
    ax_o.set_ylabel("a / ℓ", fontsize=size)
    ax_o.set_xlabel("key j (a point after each tile)", fontsize=size)

    score_bars = ax_s.bar(keys, scores, color=UNSEEN, width=0.8, bottom=0, animated=True)
    m_line = ax_s.axhline(np.nan, color=BLACK, linestyle="--", linewidth=1.2, animated=True)
    m_old = ax_s.axhline(np.nan, color=BLACK, linestyle=":", linewidth=1.2, animated=True)
    before = ax_e.bar(keys, np.zeros(S), width=0.8, fill=False, edgecolor=GREY, linewidth=1,
                      animated=True)
    after = ax_e.bar(keys, np.zeros(S), width=0.8, color=BLUE, animated=True)
    (path,) = ax_o.plot([], [], color=BLUE, marker="o", markersize=4, linewidth=1.5,
                        animated=True)
    (point,) = ax_o.plot([], [], color=ORANGE, marker="o", markersize=9, linestyle="none",
                         animated=True)
    patches = [*score_bars, *before, *after]

    def draw(k: int) -> list[Artist]:
        t = min(k, n_tiles)
        end, start = int(steps.end[t]), int(steps.end[max(t - 1, 0)])
        for j, bar in enumerate(score_bars):
            bar.set_color(UNSEEN if j >= end else ORANGE if j >= start else BLUE)
        m, l = steps.m[t], steps.l[t]
        seen = keys < end
        current = np.exp(scores - m) * seen if t else np.zeros(S)  # (S,)
        old = np.exp(scores - steps.m[t - 1]) * (keys < start) if t > 1 else np.zeros(S)
        for j in range(S):
            after[j].set_height(current[j])
            after[j].set_color(ORANGE if start <= j < end else BLUE)
            after[j].set_visible(j < end)
            before[j].set_height(old[j])
            before[j].set_visible(j < start and t > 1)
        m_line.set_ydata([m, m] if t else [np.nan, np.nan])
        rose = t > 1 and steps.rescale[t] < 1
        m_old.set_ydata([steps.m[t - 1]] * 2 if rose else [np.nan, np.nan])
        path.set_data(steps.end[1:t + 1] - 0.5, steps.out[1:t + 1])
        point.set_data(steps.end[t:t + 1] - 0.5 if t else [], steps.out[t:t + 1] if t else [])
        if t == 0:
            ax_s.set_title(f"tile size {tile}: nothing read yet, m = −∞", fontsize=size)
            ax_e.set_title("ℓ = 0, a = 0", fontsize=size)
            ax_o.set_title("no output yet (0 / 0)", fontsize=size)
            return [*patches, m_line, m_old, path, point, ax_s.title, ax_e.title, ax_o.title]
        was = f" (was {steps.m[t - 1]:.2f})" if rose else (
            " (first tile)" if t == 1 else " (unchanged)")
        ax_s.set_title(f"tile {t} of {n_tiles}: keys {start}–{end - 1}{cut}max m = {m:.2f}{was}",
                       fontsize=size)
        factor = "0 (first tile)" if t == 1 else f"{steps.rescale[t]:.3f}"
        ax_e.set_title(f"old sums × $e^{{m_{{old}} - m}}$ = {factor}{cut}"
                       f"ℓ = sum of the bars = {l:.3f}", fontsize=size)
        ratio = f"a / ℓ = {steps.a[t]:.3f} / {l:.3f} = {steps.out[t]:.3f}"
        if k > n_tiles:
            ax_o.set_title(f"step {k}: all {n_tiles} tiles read already{cut}{ratio}",
                           fontsize=size)
        elif t == n_tiles:
            ax_o.set_title(f"all keys read{cut if narrow else ': '}{ratio}, the exact output",
                           fontsize=size)
        else:
            ax_o.set_title(f"partial output {ratio}", fontsize=size)
        return [*patches, m_line, m_old, path, point, ax_s.title, ax_e.title, ax_o.title]

    return _render_frames(fig, n_frames, draw)


def _check_arguments(n_keys: int, tile_sizes: Sequence[int]) -> tuple[int, ...]:
    """The tile sizes as a tuple; a ValueError naming the bad values otherwise."""
    if n_keys < 2:
        raise ValueError(f"n_keys must be >= 2, got {n_keys}")
    sizes = tuple(int(b) for b in tile_sizes)
    if not sizes or len(set(sizes)) != len(sizes):
        raise ValueError(f"tile_sizes must be distinct and not empty, got {tuple(tile_sizes)}")
    bad = [b for b in sizes if not 1 <= b <= n_keys]
    if bad:
        raise ValueError(f"tile_sizes must lie in [1, n_keys = {n_keys}], got {bad}")
    return sizes


def online_softmax_explorer(*, n_keys: int = 24, tile_sizes: Sequence[int] = (3, 5, 8),
                            seed: int = 0) -> OnlineSoftmaxExplorer:
    """Explore the online softmax step by step, with or without a kernel.

    Args:
        n_keys: length S of the row of scores (one query against S keys).
        tile_sizes: the tile sizes to choose among (distinct, each in 1 … S); a tile that
            does not divide S leaves a short last tile.
        seed: seeds the scores and the scalar values.

    Returns:
        An :class:`OnlineSoftmaxExplorer` (a VBox, shown as the widget) with controls
        ``tile`` (a SelectionSlider whose ``index`` picks the tile size) and ``step`` (tiles
        read, 0 … ceil(S / smallest tile); past a size's last tile its final state) over
        ``len(tile_sizes) × (ceil(S / min(tile_sizes)) + 1)`` precomputed frames
        (``pictures["online"]``).
    """
    sizes = _check_arguments(n_keys, tile_sizes)
    n_steps = -(-n_keys // min(sizes)) + 1  # ceil(S / b) tiles, and step 0
    _check_frames("online_softmax_explorer", {"tile sizes": len(sizes), "steps": n_steps})
    scores, values = _example_row(n_keys, seed)

    style = {"description_width": "80px"}
    controls = {
        "tile": widgets.SelectionSlider(options=[(str(b), b) for b in sizes],
                                        description="tile size", style=style),
        # Opens on two tiles read: the first frame (nothing read) has empty panels.
        "step": widgets.IntSlider(min(OPENING_STEP, n_steps - 1), min=0, max=n_steps - 1,
                                  description="tiles read", style=style),
    }
    picture, narrow, links = _picture_sets(
        lambda narrow: [_online_softmax_frames(scores, values, b, n_steps, narrow)
                        for b in sizes],  # [tile][k]
        [(controls["tile"], "index"), (controls["step"], "value")])
    caption = widgets.HTML(
        f"<b>The online softmax, one tile of keys at a time.</b> One query's scores against "
        f"{n_keys} keys. Top: blue the keys read, orange the tile just read, grey the keys "
        f"not read yet; dashed the running maximum m, dotted its value before this tile "
        f"raised it. Middle: e<sup>s−m</sup> of the keys read, which sum to ℓ; the hollow "
        f"bars are the same terms before the maximum rose, and the rescale factor shrinks "
        f"them. Bottom: the partial output a / ℓ after each tile against the exact softmax "
        f"output (dashed), which the last tile reaches. All pictures are precomputed.")
    shown = [p for p in (picture, narrow) if p is not None]  # wide, or narrow on a phone
    return OnlineSoftmaxExplorer([caption, _control_row(*controls.values()), *shown],
                                 controls=controls, pictures={"online": picture},
                                 narrow={"online": narrow}, links=links,
                                 scores=scores, values=values, tile_sizes=sizes)
