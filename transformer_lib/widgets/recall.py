"""The recall explorer (chapter 9): what a fixed-size state recalls of N stored pairs, by the
pair's age, for linear attention, the delta rule (DeltaNet) and Gated DeltaNet, its forget
gate α a control.

N random unit key–value pairs are written into a ``(D, D)`` state by each memory's rule
(:func:`transformer_lib.recall.recall`), then every stored key is read back; the accuracy and
the error of each pair are averaged over many sets of pairs and drawn against the pair's age.
Every frame is rendered in advance (one per N and α), so the explorer works in the static book.
"""
from __future__ import annotations

from typing import Sequence

import ipywidgets as widgets
import numpy as np
import torch
from matplotlib.artist import Artist
from matplotlib.figure import Figure
from torch import Tensor

from transformer_lib.plotting.style import BLUE, DPI, ORANGE, PURPLE
from transformer_lib.recall import recall, recall_pairs
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

RECALL_FRAME = (FRAME_WIDTH, 5.8)  #: inches: two panels, one above the other
RECALL_NARROW_FRAME = (NARROW_WIDTH, 6.6)  #: inches: the same on a phone
#: The frames are ~750 px wide and shrink to half that on a phone: larger text, as in the
#: attention explorer.
RECALL_FONT = 14
RECALL_METHODS = ("linear attention", "delta rule", "gated delta rule")  #: the states compared
_STYLES = {"linear attention": dict(color=BLUE, linestyle="-", linewidth=1.8),
           "delta rule": dict(color=ORANGE, linestyle="--", linewidth=2.2),
           "gated delta rule": dict(color=PURPLE, linestyle="-", linewidth=2.6)}
_LEGEND = {"linear attention": "linear attention", "delta rule": "delta rule (DeltaNet)",
           "gated delta rule": "Gated DeltaNet, α"}


class RecallExplorer(Explorer):
    """The widget :func:`recall_explorer` returns.

    Besides :class:`~transformer_lib.widgets.frames.Explorer`'s ``controls`` ``n`` and
    ``alpha``, ``pictures`` ``{"recall": …}`` and ``links``, it holds:

    Attributes:
        curves: N -> the numbers behind that N's frames, as ``_recall_by_age`` returns them.
    """

    curves: dict[int, dict]

    def __init__(self, children: Sequence[widgets.Widget], *, curves: dict[int, dict],
                 **parts) -> None:
        super().__init__(children, **parts)
        self.curves = curves


def _by_age(outputs: Tensor, values: Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Accuracy and error of each stored pair, averaged over the trials, newest pair first.

    Args:
        outputs, values: ``(B, N, Dv)``, what a memory returned for each key, and the values,
            in writing order.

    Returns:
        ``(accuracy, error)``, ``(N,)`` each; entry a is the pair written ``a`` pairs before
        the last (age a + 1 in the pictures). Accuracy: the fraction of trials whose output is
        closest (largest dot product) to the right one of the N values; error: ``‖o − v‖``.
    """
    N = values.shape[1]
    scores = outputs @ values.transpose(-2, -1)  # (B, N, N): each output against each value
    right = (scores.argmax(dim=-1) == torch.arange(N)).double()  # (B, N)
    distance = (outputs - values).norm(dim=-1)  # (B, N)
    return right.mean(0).flip(0).numpy(), distance.mean(0).flip(0).numpy()  # (N,) newest first


def _recall_by_age(n_pairs: int, alphas: Sequence[float], d_state: int, trials: int,
                   seed: int) -> dict:
    """Recall by age of ``n_pairs`` pairs in a ``(d_state, d_state)`` state, for each memory.

    The pairs are ``recall_pairs(trials, n_pairs, d_state, d_state)`` drawn from a fresh
    generator seeded with ``seed``; all memories store the same pairs.

    Returns:
        ``{"accuracy": …, "error": …}``, each memory -> array: ``(N,)`` for
        ``"linear attention"`` and ``"delta rule"``, ``(A, N)`` for ``"gated delta rule"``
        (one row per α); entry ``[..., a]`` is the pair written ``a`` pairs before the last.
    """
    generator = torch.Generator().manual_seed(seed)
    keys, values = recall_pairs(trials, n_pairs, d_state, d_state, generator=generator)
    outputs = {"linear attention": [recall(keys, values, "linear")],
               "delta rule": [recall(keys, values, "delta")],
               "gated delta rule": [recall(keys, values, "gated", alpha=a) for a in alphas]}
    found: dict[str, dict[str, np.ndarray]] = {"accuracy": {}, "error": {}}
    for name, outs in outputs.items():
        accuracy, error = zip(*(_by_age(out, values) for out in outs))  # A × (N,) each
        squeeze = name != "gated delta rule"
        found["accuracy"][name] = accuracy[0] if squeeze else np.stack(accuracy)  # (A, N)
        found["error"][name] = error[0] if squeeze else np.stack(error)  # (A, N)
    return found


def _recall_frames(curves: dict, n_pairs: int, alphas: Sequence[float], d_state: int,
                   max_pairs: int, narrow: bool = False) -> list[bytes]:
    """Frames a = 0 … A-1: accuracy (top) and error (bottom) against the pair's age for
    ``n_pairs`` pairs, the gated delta rule's curves at ``alphas[a]``, the others fixed.

    Args:
        curves: the numbers of ``_recall_by_age`` for this N.
        n_pairs, alphas, d_state: N, the forget gates and the state's D.
        max_pairs: the age axes run from 1 to this, the same in every frame.
        narrow: the frames for a phone (``NARROW_WIDTH`` wide, longer texts on more lines).

    Returns:
        A palette PNGs, one per α; the title of each gives the three memories' mean accuracy.
    """
    ages = np.arange(1, n_pairs + 1)  # 1 = written last
    size = NARROW_FONT if narrow else RECALL_FONT
    cut = "\n" if narrow else " "  # where a long text breaks on a phone
    fig = Figure(figsize=RECALL_NARROW_FRAME if narrow else RECALL_FRAME, dpi=DPI,
                 layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True)
    gated = {}
    for ax, field in ((top, "accuracy"), (bottom, "error")):
        for name in RECALL_METHODS[:2]:
            ax.plot(ages, curves[field][name], label=_LEGEND[name], **_STYLES[name])
        (gated[field],) = ax.plot([], [], label=_LEGEND["gated delta rule"],
                                  **_STYLES["gated delta rule"], animated=True)
        ax.axvline(n_pairs, color="grey", linestyle=":", linewidth=1)
        ax.tick_params(labelsize=size - 1)
        ax.grid(alpha=0.3)
    top.set_xscale("log", base=2)
    top.set_xlim(1, max_pairs * 1.05)
    ticks = [2 ** i for i in range(int(np.log2(max_pairs)) + 1)]
    bottom.set_xticks(ticks, labels=[str(t) for t in ticks])
    bottom.minorticks_off()
    top.set_ylim(-0.03, 1.05)
    top.set_ylabel("keys recognised", fontsize=size)
    top.set_title("\n\n" if narrow else "\n", fontsize=size)  # room for the frame titles
    bottom.axhline(1, color="grey", linestyle="--", linewidth=1)  # as far as reading nothing
    worst = max(float(np.max(curves["error"][name])) for name in RECALL_METHODS)
    bottom.set_ylim(0, max(1.5, 1.1 * worst))
    bottom.set_ylabel(r"error $\|o - v\|$", fontsize=size)
    bottom.set_xlabel(f"age of the pair{cut}(1 = written last; dotted: the oldest, N)",
                      fontsize=size)
    fig.legend(handles=[*top.lines[:2], gated["accuracy"]], loc="outside lower center",
               ncols=1 if narrow else 3, fontsize=size - 1 if narrow else size - 2,
               frameon=False)
    mean = {name: float(np.mean(curves["accuracy"][name]))
            for name in RECALL_METHODS[:2]}

    def draw(a: int) -> list[Artist]:
        for field, line in gated.items():
            line.set_data(ages, curves[field]["gated delta rule"][a])
        recognised = float(np.mean(curves["accuracy"]["gated delta rule"][a]))
        linear, delta = mean["linear attention"], mean["delta rule"]
        top.set_title(f"N = {n_pairs} pairs in a {d_state} × {d_state} state, "
                      f"α = {alphas[a]:g}\nrecognised: linear {linear:.0%},{cut}"
                      f"delta {delta:.0%}, gated {recognised:.0%}", fontsize=size)
        return [*gated.values(), top.title]

    return _render_frames(fig, len(alphas), draw)


def _alt_text(curves: dict, n_pairs: int, alpha_index: int, alpha: float,
              d_state: int) -> str:
    """The text alternative of one frame: each memory's accuracy from the newest pair to the
    oldest, its mean, and its error on the oldest pair."""
    parts, oldest = [], []
    for name, label in zip(RECALL_METHODS, ("linear attention", "delta rule",
                                            "Gated DeltaNet")):
        accuracy, error = curves["accuracy"][name], curves["error"][name]
        if name == "gated delta rule":
            accuracy, error = accuracy[alpha_index], error[alpha_index]
        parts.append(f"{label} {accuracy[0]:.0%} to {accuracy[-1]:.0%} "
                     f"(mean {np.mean(accuracy):.0%})")
        oldest.append(f"{label} {error[-1]:.2f}")
    return (f"{n_pairs} pairs in a {d_state} × {d_state} state, forget gate α = {alpha:g}. "
            f"Keys recognised, from the newest pair to the oldest: {'; '.join(parts)}. "
            f"Error on the oldest pair (1 is as far as reading nothing): "
            f"{', '.join(oldest)}.")


def _recall_caption(d_state: int, trials: int) -> widgets.HTML:
    """What the pictures show."""
    return widgets.HTML(
        f"<b>What a {d_state} × {d_state} state recalls, by the pair's age.</b> N random "
        f"key–value pairs are written into the state, then every stored key is read back "
        f"({trials} sets of pairs per N). Top: the fraction of keys whose value comes back "
        f"closest to the right one of the N; bottom: the mean error ‖o − v‖ (dashed: 1, as far "
        f"as reading nothing). Blue: linear attention; orange: the delta rule (β = 1); purple: "
        f"Gated DeltaNet, which shrinks the state by α before each write. All pictures are "
        f"precomputed.")


def _check_arguments(n_pairs: Sequence[int], alphas: Sequence[float], d_state: int,
                     trials: int, n: int, alpha: float) -> None:
    """Raise a ValueError naming the bad values of :func:`recall_explorer`'s arguments."""
    if len(n_pairs) < 2 or any(int(x) != x or x < 2 for x in n_pairs) or \
            list(n_pairs) != sorted(set(n_pairs)):
        raise ValueError(f"n_pairs must be two or more increasing whole numbers >= 2, "
                         f"got {list(n_pairs)}")
    if len(alphas) < 2 or any(not 0 < a <= 1 for a in alphas) or \
            list(alphas) != sorted(set(alphas)):
        raise ValueError(f"alphas must be two or more increasing forget gates in (0, 1], "
                         f"got {list(alphas)}")
    if d_state < 1 or trials < 1:
        raise ValueError(f"d_state ({d_state}) and trials ({trials}) must be >= 1")
    if n not in n_pairs:
        raise ValueError(f"n ({n}) must be one of n_pairs {list(n_pairs)}")
    if alpha not in alphas:
        raise ValueError(f"alpha ({alpha}) must be one of alphas {list(alphas)}")


def recall_explorer(*, n_pairs: Sequence[int] = (8, 16, 32, 64, 128),
                    alphas: Sequence[float] = (0.5, 0.8, 0.9, 0.95, 0.99, 1.0),
                    d_state: int = 32, trials: int = 200, seed: int = 0, n: int = 64,
                    alpha: float = 0.95) -> RecallExplorer:
    """Explore what a fixed-size state recalls as the number of stored pairs N and Gated
    DeltaNet's forget gate α move, with or without a kernel.

    Args:
        n_pairs: the numbers of pairs N to choose from, increasing, each >= 2.
        alphas: the forget gates α to choose from, increasing, in (0, 1] (α = 1: the delta
            rule's own curves).
        d_state: D, the keys' and values' length: the state holds D × D numbers.
        trials: sets of pairs each curve averages over.
        seed: seeds the pairs (every N draws its own from a generator seeded with it).
        n, alpha: the N and α shown first, one of ``n_pairs`` and of ``alphas``.

    Returns:
        A :class:`RecallExplorer` (a VBox, shown as the widget) with controls ``n`` and
        ``alpha`` (SelectionSliders whose ``index`` picks the frame) over
        ``len(n_pairs) × len(alphas)`` precomputed frames (``pictures["recall"]``), and the
        numbers behind them (``curves``).
    """
    _check_arguments(n_pairs, alphas, d_state, trials, n, alpha)
    _check_frames("recall_explorer", {"N": len(n_pairs), "α": len(alphas)})
    curves = {int(x): _recall_by_age(int(x), alphas, d_state, trials, seed) for x in n_pairs}

    style = {"description_width": "80px"}
    controls = {
        "n": widgets.SelectionSlider(options=[(str(x), x) for x in curves], value=n,
                                     description="pairs N", style=style),
        "alpha": widgets.SelectionSlider(options=[(f"{a:g}", a) for a in alphas], value=alpha,
                                         description="forget α", style=style),
    }
    pairs = [(controls["n"], "index"), (controls["alpha"], "index")]
    picture, narrow, links = _picture_sets(
        lambda narrow: [_recall_frames(curves[x], x, alphas, d_state, max(curves), narrow)
                        for x in curves], pairs)
    # The pictures' text alternative, in words under them (an Image has no alt attribute).
    alt = [[_alt_text(curves[x], x, a, alpha_a, d_state) for a, alpha_a in enumerate(alphas)]
           for x in curves]  # [n][alpha]
    text, text_links = _linked_pictures(alt, pairs)
    return RecallExplorer([_recall_caption(d_state, trials), _control_row(*controls.values()),
                           widgets.VBox([p for p in (picture, narrow) if p is not None]
                                        + [text])], controls=controls,
                          pictures={"recall": picture, "text": text},
                          narrow={"recall": narrow},
                          links=links + text_links, curves=curves)
