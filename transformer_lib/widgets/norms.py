"""The gradient-profile explorer (chapter 4): the gradient each layer of a freshly initialised
encoder–decoder receives, post-norm against pre-norm, as the depth grows.

The profiles are measured once by ``bench/gradient_profile.py`` (one batch forward and
backward through fresh reversal models of 2 to 16 layers per stack, five seeds each) and ship
with the library as ``transformer_lib/data/gradient_profile.json``; every frame is rendered
in advance, so the explorer works in the static book.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import ipywidgets as widgets
import numpy as np
from matplotlib.artist import Artist
from matplotlib.figure import Figure

from transformer_lib.plotting.style import DPI, RUN_COLOURS
from transformer_lib.resources import load_json
from transformer_lib.widgets.frames import (
    FRAME_WIDTH,
    NARROW_FONT,
    NARROW_WIDTH,
    Explorer,
    _check_frames,
    _control_row,
    _labels,
    _picture_sets,
    _render_frames,
)

#: the precomputed profiles, in transformer_lib/data/
GRADIENT_PROFILE_FILE = "gradient_profile.json"
PLACEMENTS = ("post-norm", "pre-norm")  #: where the norm sits in each layer
STACKS = ("decoder", "encoder")  #: the stacks a profile is measured in
GRADIENT_FONT = 14  #: a full-column frame shrinks to half on a phone: larger text
GRADIENT_FRAME = (FRAME_WIDTH, 4.6)  #: the frame's (width, height) in inches
GRADIENT_NARROW_FRAME = (NARROW_WIDTH, 4.4)  #: inches: the frame on a phone
#: The line style of each placement, the same as the chapter's figure's.
STYLES = {"post-norm": {"color": RUN_COLOURS[1], "marker": "o"},
          "pre-norm": {"color": RUN_COLOURS[0], "marker": "s"}}

Profiles = dict[str, dict[str, dict[int, np.ndarray]]]  #: placement -> stack -> depth -> (R, depth)


class GradientExplorer(Explorer):
    """The widget :func:`gradient_explorer` returns.

    Besides :class:`~transformer_lib.widgets.frames.Explorer`'s ``controls`` (``depth`` and
    ``stack``), ``pictures`` (``{"profile": …}``) and ``links``, it holds:

    Attributes:
        profiles: what the frames show: ``profiles[placement][stack][depth]``, an array
            ``(seeds, depth)`` of gradient norms, layer 1 first.
        depths: the depths to choose from, in order.
    """

    profiles: Profiles
    depths: list[int]

    def __init__(self, children: Sequence[widgets.Widget], *, profiles: Profiles,
                 depths: list[int], **parts) -> None:
        super().__init__(children, **parts)
        self.profiles, self.depths = profiles, depths


def load_gradient_profile(file: str = GRADIENT_PROFILE_FILE) -> dict[str, Any]:
    """The precomputed gradient profiles that ship with the library, written by
    ``bench/gradient_profile.py``: ``"settings"`` (depths, seeds, batch), ``"profiles"``
    (``[placement][stack][str(depth)]``: one list of per-layer norms per seed), ``"command"``,
    ``"cpu_seconds"`` and ``"machine"``.

    Args:
        file: the file's name in ``transformer_lib/data/``.
    """
    return load_json(file)


def _profiles(data: Mapping[str, Any]) -> tuple[Profiles, list[int]]:
    """Check ``data`` (as :func:`load_gradient_profile` returns it) and turn its lists into
    arrays ``(seeds, depth)``. Raises a ValueError naming what is missing or misshapen."""
    raw = data.get("profiles") if isinstance(data, Mapping) else None
    if not isinstance(raw, Mapping) or set(raw) != set(PLACEMENTS):
        found = sorted(raw) if isinstance(raw, Mapping) else type(raw).__name__
        raise ValueError(f"data['profiles'] must have the placements {PLACEMENTS}, got {found}")
    depths = None
    profiles: Profiles = {}
    for placement in PLACEMENTS:
        by_stack = raw[placement]
        if not isinstance(by_stack, Mapping) or set(by_stack) != set(STACKS):
            found = sorted(by_stack) if isinstance(by_stack, Mapping) else type(by_stack).__name__
            raise ValueError(f"data['profiles'][{placement!r}] must have the stacks {STACKS}, "
                             f"got {found}")
        profiles[placement] = {}
        for stack in STACKS:
            by_depth = {int(d): np.asarray(v, dtype=float)
                        for d, v in raw[placement][stack].items()}
            if depths is None:
                depths = sorted(by_depth)
            if sorted(by_depth) != depths or len(depths) < 2 or depths[0] < 1:
                raise ValueError(f"every placement and stack needs the same depths, two or "
                                 f"more, each >= 1: {placement} {stack} has {sorted(by_depth)}, "
                                 f"the first had {depths}")
            for d, values in by_depth.items():
                if values.ndim != 2 or values.shape[1] != d or len(values) == 0:
                    raise ValueError(f"{placement} {stack} depth {d}: expected (seeds, {d}) "
                                     f"gradient norms, got shape {values.shape}")
                if not (np.isfinite(values).all() and (values > 0).all()):
                    raise ValueError(f"{placement} {stack} depth {d}: gradient norms must be "
                                     f"finite and > 0 (drawn on a log scale)")
            profiles[placement][stack] = by_depth
    return profiles, depths


def first_over_last(norms: np.ndarray) -> float:
    """The median over seeds of layer 1's gradient norm over the top layer's, of ``norms``
    ``(seeds, depth)``: below 1, the first layer gets less than the last."""
    return float(np.median(norms[:, 0] / norms[:, -1]))


def _y_limits(profiles: Profiles) -> tuple[float, float]:
    """One log-scale y range for every frame, so that moving a control moves the curves, not
    the axis."""
    values = np.concatenate([v.ravel() for by_stack in profiles.values()
                             for by_depth in by_stack.values() for v in by_depth.values()])
    return float(values.min()) / 1.6, float(values.max()) * 1.6


def _gradient_frames(profiles: Profiles, stack: str, depths: Sequence[int],
                     ylim: tuple[float, float], narrow: bool = False) -> list[bytes]:
    """Frames k = 0 … len(depths)-1 of one stack: the gradient norm of each layer of models
    with ``depths[k]`` layers, post-norm and pre-norm, median over seeds on a band from the
    lowest to the highest, on a fixed log-scale y axis ``ylim`` and x axis 1 … max depth.
    ``narrow``: the frames for a phone (its title on three lines)."""
    size = NARROW_FONT if narrow else GRADIENT_FONT
    fig = Figure(figsize=GRADIENT_NARROW_FRAME if narrow else GRADIENT_FRAME, dpi=DPI,
                 layout="constrained")
    ax = fig.add_subplot()
    ax.set(yscale="log", ylim=ylim, xlim=(0.5, max(depths) + 0.5), xticks=list(depths))
    ax.grid(True, which="major", color="#dddddd", linewidth=0.8)
    _labels(ax, f"{stack} layer (1 = first)", "gradient norm", size)
    if narrow:
        ax.set_title("\n\n", fontsize=size)  # room for three lines
    lines = {name: ax.plot([], [], linewidth=2, markersize=6, label=name, animated=True,
                           **STYLES[name])[0] for name in PLACEMENTS}
    ax.legend(loc="lower right", fontsize=size - 1, ncols=2)
    bands: list[Artist] = []

    def draw(k: int) -> list[Artist]:
        depth = depths[k]
        layers = np.arange(1, depth + 1)
        for band in bands:
            band.remove()
        bands.clear()
        for name in PLACEMENTS:
            norms = profiles[name][stack][depth]  # (seeds, depth)
            lines[name].set_data(layers, np.median(norms, axis=0))
            bands.append(ax.fill_between(layers, norms.min(axis=0), norms.max(axis=0),
                                         color=STYLES[name]["color"], alpha=0.2, linewidth=0,
                                         animated=True))
        post, pre = (first_over_last(profiles[name][stack][depth]) for name in PLACEMENTS)
        ratios = f"post-norm {post:.2g}, pre-norm {pre:.2g}"
        if narrow:
            title = (f"{stack}, {depth} layers per stack\nat initialisation, "
                     f"layer 1 / layer {depth}:\n{ratios}")
        else:
            title = (f"{stack}, {depth} layers per stack, at initialisation\n"
                     f"layer 1 / layer {depth}: {ratios}")
        ax.set_title(title, fontsize=size)
        return [*bands, *lines.values(), ax.title]

    return _render_frames(fig, len(depths), draw)


def _caption(n_seeds: int) -> widgets.HTML:
    """What the picture shows and how to read it."""
    return widgets.HTML(
        "<b>The gradient each layer receives at initialisation, post-norm against pre-norm."
        f"</b> For fresh reversal models with the chosen number of layers per stack: the norm "
        f"of the gradient of each layer's parameters after one batch, median of {n_seeds} "
        "initialisations (band: lowest to highest), on a log scale. The title gives layer 1's "
        "gradient over the top layer's (median over the initialisations). Nothing is "
        "trained; all pictures are precomputed.")


def gradient_explorer(data: Mapping[str, Any] | None = None, *,
                      depth: int = 8) -> GradientExplorer:
    """Explore how the gradient each layer receives depends on the depth and on where the
    norm sits, with or without a kernel.

    Args:
        data: gradient profiles as :func:`load_gradient_profile` returns them; by default
            the ones that ship with the library (depths 2, 4, 6, 8, 12, 16; seeds 0-4).
        depth: the depth shown first; one of the depths in ``data``.

    Returns:
        A :class:`GradientExplorer` (a VBox, shown as the widget) with controls ``depth``
        (layers per stack, a SelectionSlider whose ``index`` picks the frame) and ``stack``
        (decoder or encoder, a Dropdown) over ``2 × len(depths)`` precomputed frames
        (``pictures["profile"]``), and the numbers they show (``profiles``).
    """
    profiles, depths = _profiles(load_gradient_profile() if data is None else data)
    if depth not in depths:
        raise ValueError(f"depth must be one of the measured depths {depths}, got {depth}")
    _check_frames("gradient_explorer", {"stacks": len(STACKS), "depths": len(depths)})
    ylim = _y_limits(profiles)

    style = {"description_width": "80px"}
    controls = {
        "depth": widgets.SelectionSlider(options=[(str(d), d) for d in depths], value=depth,
                                         description="layers", style=style),
        # A Dropdown rather than ToggleButtons: a <select> moves with the arrow keys.
        "stack": widgets.Dropdown(options=[(name, s) for s, name in enumerate(STACKS)],
                                  description="stack", style=style),
    }
    picture, narrow, links = _picture_sets(
        lambda narrow: [_gradient_frames(profiles, stack, depths, ylim, narrow)
                        for stack in STACKS],  # [stack][k]
        [(controls["stack"], "index"), (controls["depth"], "index")])
    n_seeds = len(next(iter(profiles["post-norm"]["decoder"].values())))
    shown = [p for p in (picture, narrow) if p is not None]  # wide, or narrow on a phone
    return GradientExplorer([_caption(n_seeds), _control_row(*controls.values()), *shown],
                            controls=controls, pictures={"profile": picture},
                            narrow={"profile": narrow}, links=links,
                            profiles=profiles, depths=depths)
