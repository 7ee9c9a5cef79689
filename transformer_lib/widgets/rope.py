"""The RoPE explorer (chapter 5 and the appendix): one channel pair of a fixed query and key
turned to the chosen position, and the full score against the offset n − m.

Every frame is rendered in advance, so the explorer works in the static book.
"""
from __future__ import annotations

from typing import Sequence

import ipywidgets as widgets
import numpy as np
import torch
from matplotlib.artist import Artist
from matplotlib.figure import Figure
from matplotlib.patches import Circle, FancyArrowPatch
from torch import Tensor

from transformer_lib.plotting.style import BLUE, DPI, VERMILLION
from transformer_lib.positional import (
    PAIRINGS,
    apply_rope,
    pair_channels,
    rope_cos_sin,
    rope_frequencies,
)
from transformer_lib.widgets.frames import (
    FONT,
    FRAME_WIDTH,
    Explorer,
    Frames,
    _check_frames,
    _control_row,
    _labels,
    _linked_pictures,
    _render_frames,
)

KEY_OFFSET = 2  #: rope_explorer draws k at n = m - KEY_OFFSET: before q, as in a causal model
ROPE_FRAME = (FRAME_WIDTH / 2 - 0.05, 3.8)  #: inches: the two pictures side by side
Q_COLOUR, K_COLOUR = BLUE, VERMILLION  # the query and the key, in both pictures


class RopeExplorer(Explorer):
    """The widget :func:`rope_explorer` returns.

    Besides :class:`~transformer_lib.widgets.frames.Explorer`'s ``controls`` ``m``, ``i``,
    ``pairing``, ``pictures`` ``{"pair": …, "score": …}`` and ``links``, it holds:

    Attributes:
        q, k: the fixed random query and key the pictures turn, ``(D,)`` each.
    """

    q: Tensor
    k: Tensor

    def __init__(self, children: Sequence[widgets.Widget], *, q: Tensor, k: Tensor,
                 **parts) -> None:
        super().__init__(children, **parts)
        self.q, self.k = q, k


def _rope_rotated(x: Tensor, n_positions: int, theta: float, pairing: str) -> Tensor:
    """``x`` ``(D,)`` placed at positions 0 … n_positions-1 and rotated by RoPE: ``(P, D)``."""
    cos, sin = rope_cos_sin(n_positions, x.shape[-1], theta)  # (P, D/2) each
    return apply_rope(x.expand(n_positions, -1), cos, sin, pairing)  # (P, D)


def _rope_score_table(q: Tensor, k: Tensor, theta: float, n_positions: int,
                      pairing: str) -> Tensor:
    """Scores ``table[m, n] = q_mᵀ k_n`` of fixed vectors q, k ``(D,)`` rotated to positions
    m, n.

    Returns:
        ``(P, P)``; it depends on n − m only, so row m against n − m is the same curve for
        every m.
    """
    q_rot = _rope_rotated(q, n_positions, theta, pairing)  # (P, D)
    k_rot = _rope_rotated(k, n_positions, theta, pairing)  # (P, D)
    return q_rot @ k_rot.T  # (P, D) @ (D, P) -> (P, P)


def _rope_pair_frames(q: Tensor, k: Tensor, i: int, theta: float, n_positions: int,
                      pairing: str) -> list[bytes]:
    """Frames j = 0 … P-1 of channel pair i: q rotated to position m = j + KEY_OFFSET, k to
    n = j = m - KEY_OFFSET."""
    D = q.shape[-1]
    a, b = pair_channels(i, D, pairing)
    n_pos = n_positions + KEY_OFFSET
    q2 = _rope_rotated(q, n_pos, theta, pairing)[:, [a, b]].numpy()  # (P + offset, 2)
    k2 = _rope_rotated(k, n_pos, theta, pairing)[:, [a, b]].numpy()  # (P + offset, 2)
    theta_i = float(rope_frequencies(D, theta)[i])
    radius = 1.25 * max(np.linalg.norm(q2[0]), np.linalg.norm(k2[0]))
    fig = Figure(figsize=ROPE_FRAME, dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    for v, colour in ((q2[0], Q_COLOUR), (k2[0], K_COLOUR)):
        ax.add_patch(Circle((0, 0), np.linalg.norm(v), fill=False, linestyle=":", color=colour,
                            alpha=0.5))
    ax.axhline(0, color="lightgrey", linewidth=0.8)
    ax.axvline(0, color="lightgrey", linewidth=0.8)
    ax.set(xlim=(-radius, radius), ylim=(-radius, radius), aspect="equal")
    _labels(ax, f"channel {a}", f"channel {b}")
    arrows = [ax.add_patch(FancyArrowPatch((0, 0), (0, 0), arrowstyle="-|>", mutation_scale=12,
                                           color=colour, linewidth=2, animated=True))
              for colour in (Q_COLOUR, K_COLOUR)]

    def draw(j: int) -> list[Artist]:
        m, n = j + KEY_OFFSET, j
        arrows[0].set_positions((0, 0), tuple(q2[m]))
        arrows[1].set_positions((0, 0), tuple(k2[n]))
        ax.set_title(f"pair {i}: {theta_i:.3g} rad per position\n"
                     f"m = {m}, n = {n}: q·k here {float(q2[m] @ k2[n]):+.3f}", fontsize=FONT)
        return [*arrows, ax.title]

    return _render_frames(fig, n_positions, draw)


def _rope_score_frames(q: Tensor, k: Tensor, theta: float, n_positions: int,
                       pairing: str) -> list[bytes]:
    """Frames j = 0 … P-1: the score q_mᵀ k_n of the query at m = j + KEY_OFFSET against
    n − m, the curves of every other m faint behind it."""
    n_pos = n_positions + KEY_OFFSET
    table = _rope_score_table(q, k, theta, n_pos, pairing).numpy()  # (P + offset, P + offset)
    positions = np.arange(n_pos)
    fig = Figure(figsize=ROPE_FRAME, dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    for m in positions[KEY_OFFSET:]:
        ax.plot(positions - m, table[m], color="grey", alpha=0.35, linewidth=1)
    ax.axvline(-KEY_OFFSET, color=K_COLOUR, linestyle=":", linewidth=1)
    _labels(ax, "offset n − m", r"score $q_m^\top k_n$")
    (curve,) = ax.plot([], [], color=Q_COLOUR, marker="o", markersize=3, linewidth=2,
                       animated=True)

    def draw(j: int) -> list[Artist]:
        m = j + KEY_OFFSET
        curve.set_data(positions - m, table[m])
        ax.set_title(f"all {q.shape[-1]} channels, {pairing}, m = {m}\n"
                     f"grey: every other m", fontsize=FONT)
        return [curve, ax.title]

    return _render_frames(fig, n_positions, draw)


def _rope_caption(head_dim: int) -> widgets.HTML:
    """What the two pictures show and what to try."""
    return widgets.HTML(
        f"<b>RoPE turns each channel pair by an angle proportional to the position.</b> Left: "
        f"channel pair i of a fixed random query q at position m (blue) and key k at position "
        f"n = m − {KEY_OFFSET} (red), earlier, as keys are in a causal model. Move m: both "
        f"turn by the same angle, so their dot product in this pair never changes. \"half\" "
        f"pairs channel i with i + {head_dim // 2}, \"interleaved\" 2i with 2i+1. Right: the "
        f"full score q<sub>m</sub>ᵀk<sub>n</sub> over all {head_dim} channels against the "
        f"offset n − m; the curves of every other m (grey) lie on it: the score depends on "
        f"n − m only. Dotted red: n − m = −{KEY_OFFSET}.")


def rope_explorer(*, head_dim: int = 16, theta: float = 10000.0, n_positions: int = 16,
                  seed: int = 0) -> RopeExplorer:
    """Explore rotary position embeddings (RoPE), with or without a kernel.

    Args:
        head_dim: channels of the fixed random q and k, even.
        theta: RoPE base; pair i turns by θ_i = theta^(-2i/head_dim) radians per position.
        n_positions: how many query positions to choose from, m = KEY_OFFSET …
            KEY_OFFSET + n_positions - 1 (the key sits KEY_OFFSET positions earlier).
        seed: seeds q and k.

    Returns:
        A :class:`RopeExplorer` (a VBox, shown as the widget) with controls ``m`` (the query's
        position, a SelectionSlider whose ``index`` picks the frame),
        ``i`` (pair) and ``pairing`` (index into ``PAIRINGS``) and two pictures:
        ``pictures["pair"]``, pair i of q at m and k at m - KEY_OFFSET (``2 × P × D/2``
        frames), and ``pictures["score"]``, the full score against n − m (``2 × P`` frames).
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
    by_pair = [[_rope_pair_frames(q, k, i, theta, n_positions, pairing)
                for i in range(head_dim // 2)] for pairing in PAIRINGS]  # [pairing][i][m]
    pair_frames = [[Frames(ms, min(f.text_px for f in frames)) for ms in zip(*frames)]
                   for frames in by_pair]  # [pairing][m][i]
    score_frames = [_rope_score_frames(q, k, theta, n_positions, pairing) for pairing in PAIRINGS]

    style = {"description_width": "80px"}
    controls = {
        "m": widgets.SelectionSlider(
            options=[(str(m), m) for m in range(KEY_OFFSET, KEY_OFFSET + n_positions)],
            description="position m", style=style),
        "i": widgets.IntSlider(0, min=0, max=head_dim // 2 - 1, description="pair i",
                               style=style),
        # A Dropdown rather than ToggleButtons: a <select> moves with the arrow keys.
        "pairing": widgets.Dropdown(options=[(name, p) for p, name in enumerate(PAIRINGS)],
                                    description="pairing", style=style),
    }
    pair, pair_links = _linked_pictures(pair_frames, [(controls["pairing"], "index"),
                                                      (controls["m"], "index"),
                                                      (controls["i"], "value")])
    score, score_links = _linked_pictures(score_frames, [(controls["pairing"], "index"),
                                                         (controls["m"], "index")])
    for picture in (pair, score):  # side by side; one above the other on a phone
        picture.layout = widgets.Layout(flex="1 1 300px", min_width="0")
    row = widgets.Box([pair, score], layout=widgets.Layout(
        display="flex", flex_flow="row wrap", justify_content="center", width="100%"))
    return RopeExplorer([_rope_caption(head_dim), _control_row(*controls.values()), row],
                        controls=controls, pictures={"pair": pair, "score": score},
                        links=pair_links + score_links, q=q, k=k)
