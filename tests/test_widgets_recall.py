"""The recall explorer (chapter 9): its numbers against an independent fp64 recurrence and the
library's recall split by age, its frames against the renderer, its links, its kernel path,
its alt text, its arguments and its weight."""
import io

import ipywidgets as widgets
import numpy as np
import pytest
import torch
from ipywidgets.widgets.widget_link import Link
from matplotlib.colors import to_rgb
from PIL import Image
from widget_support import every_widget, images

from transformer_lib import widgets as W
from transformer_lib.plotting.style import PURPLE
from transformer_lib.recall import recall, recall_by_age, recall_pairs
from transformer_lib.widgets.recall import _recall_frames

# Draws figures or explorer frames, seconds of CPU each: `make test` runs them, `make check` not.
pytestmark = pytest.mark.figures

N_PAIRS, ALPHAS, D, TRIALS, SEED = (4, 8, 16), (0.5, 0.9, 1.0), 8, 30, 3
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _small(**overrides):
    kwargs = dict(n_pairs=N_PAIRS, alphas=ALPHAS, d_state=D, trials=TRIALS, seed=SEED, n=8,
                  alpha=0.9)
    return W.recall_explorer(**{**kwargs, **overrides})


@pytest.fixture(scope="module")
def small():
    return _small()


@pytest.fixture(scope="module")
def default():
    return W.recall_explorer()


# The numbers: an fp64 recurrence written here, and the library's split by age ---------------


def _state_outputs(keys: np.ndarray, values: np.ndarray, alpha: float | None) -> np.ndarray:
    """Write the pairs into a (D, D) state one by one and read every key back: linear attention
    (alpha None: S += v kᵀ) or the gated delta rule with β = 1 (S = α S (I − k kᵀ) + v kᵀ;
    α = 1 is the delta rule). keys, values (B, N, D) -> outputs (B, N, D)."""
    B, N, Dk = keys.shape
    S = np.zeros((B, values.shape[-1], Dk))
    for t in range(N):
        k, v = keys[:, t], values[:, t]  # (B, Dk), (B, Dv)
        write = v[:, :, None] * k[:, None, :]  # (B, Dv, Dk): v kᵀ
        if alpha is None:
            S = S + write
        else:
            Sk = np.einsum("bvk,bk->bv", S, k)  # (B, Dv): what the state returns for k
            S = alpha * (S - Sk[:, :, None] * k[:, None, :]) + write
    return np.einsum("bvk,bnk->bnv", S, keys)  # (B, N, Dv)


def _by_age(outputs: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per pair, newest first: the share of trials whose output is nearest (dot product) to
    its own value, and the mean distance to it."""
    N = values.shape[1]
    right = np.einsum("bnv,bmv->bnm", outputs, values).argmax(-1) == np.arange(N)  # (B, N)
    distance = np.linalg.norm(outputs - values, axis=-1)  # (B, N)
    return right.mean(0)[::-1], distance.mean(0)[::-1]


@pytest.mark.parametrize("n", N_PAIRS)
def test_curves_match_an_independent_recurrence(small, n):
    """The accuracy and error by age behind each N's frames equal those of the recurrences
    written here in NumPy on the same pairs (fp64), for every memory and every α."""
    keys, values = recall_pairs(TRIALS, n, D, D, generator=torch.Generator().manual_seed(SEED))
    keys, values = keys.numpy(), values.numpy()
    curves = small.curves[n]
    expected = {"linear attention": [_by_age(_state_outputs(keys, values, None), values)],
                "delta rule": [_by_age(_state_outputs(keys, values, 1.0), values)],
                "gated delta rule": [_by_age(_state_outputs(keys, values, a), values)
                                     for a in ALPHAS]}
    for name, found in expected.items():
        accuracy, error = (np.stack(x) for x in zip(*found))  # (A, N) each
        if name != "gated delta rule":  # one curve, (N,)
            accuracy, error = accuracy[0], error[0]
        assert curves["accuracy"][name].shape == accuracy.shape
        np.testing.assert_array_equal(curves["accuracy"][name], accuracy)
        np.testing.assert_allclose(curves["error"][name], error, rtol=0, atol=1e-12)
    # α = 1 forgets nothing: the gated memory is the delta rule
    np.testing.assert_allclose(curves["error"]["gated delta rule"][-1],
                               curves["error"]["delta rule"], rtol=0, atol=1e-12)
    assert not np.allclose(curves["error"]["gated delta rule"][0], curves["error"]["delta rule"])


def test_curves_split_like_the_library_recall_by_age(small):
    """The mean over the newest r ages is recall_by_age's "recent" share, the rest its "old"
    share, for the library's own recall of each memory."""
    n, r = 16, 5
    keys, values = recall_pairs(TRIALS, n, D, D, generator=torch.Generator().manual_seed(SEED))
    curves = small.curves[n]
    runs = {("linear attention", None): dict(method="linear"),
            ("delta rule", None): dict(method="delta"),
            ("gated delta rule", 1): dict(method="gated", alpha=ALPHAS[1])}
    for (name, row), kwargs in runs.items():
        split = recall_by_age(recall(keys, values, **kwargs), values, r)
        accuracy, error = curves["accuracy"][name], curves["error"][name]
        if row is not None:
            accuracy, error = accuracy[row], error[row]
        assert accuracy[:r].mean() == pytest.approx(split["recent accuracy"], abs=1e-12)
        assert accuracy[r:].mean() == pytest.approx(split["old accuracy"], abs=1e-12)
        assert error[:r].mean() == pytest.approx(split["recent error"], abs=1e-12)
        assert error[r:].mean() == pytest.approx(split["old error"], abs=1e-12)


def _first_age_below_half(accuracy: np.ndarray) -> int:
    return int(np.flatnonzero(accuracy < 0.5)[0]) + 1  # ages count from 1


def test_the_default_curves_show_what_the_chapter_says(default):
    """What chapter 9 tells the reader to look for in the default explorer (32 × 32 state,
    seed 0, 200 sets of pairs)."""
    curves, alphas = default.curves, [v for _, v in default.controls["alpha"].options]
    for n in (8, 16, 32, 64, 128):
        acc, err = curves[n]["accuracy"], curves[n]["error"]
        np.testing.assert_array_equal(acc["gated delta rule"][-1], acc["delta rule"])  # α = 1
        assert acc["delta rule"][:4].min() == 1  # the 4 newest pairs, at every N
        means = acc["gated delta rule"].mean(-1)
        assert (np.diff(means) > 0).all()  # the smaller α, the fewer keys recognised
        if n >= 32:  # a horizon set by α, whatever N
            for alpha, (low, high) in {0.95: (16, 19), 0.9: (12, 15), 0.5: (4, 6)}.items():
                age = _first_age_below_half(acc["gated delta rule"][alphas.index(alpha)])
                assert low <= age <= high, (n, alpha, age)
        if n >= 64:  # old pairs fade with the gate, come back wrong without it
            oldest = err["gated delta rule"][:, -1]
            assert (np.diff(oldest) > 0).all() and abs(oldest[0] - 1) < 0.05
            assert err["delta rule"][-1] > 1.2
    linear = {n: f"{curves[n]['accuracy']['linear attention'].mean():.0%}"
              for n in (8, 32, 64, 128)}
    assert linear == {8: "100%", 32: "98%", 64: "83%", 128: "46%"}  # the frames' titles
    flat = curves[128]["accuracy"]["linear attention"]
    assert abs(flat[:32].mean() - flat[-32:].mean()) < 0.1  # the same share at every age
    delta_means = [curves[n]["accuracy"]["delta rule"].mean() for n in curves]
    assert (np.diff(delta_means) < 0).all()  # fewer and fewer of the old ones


# The frames: one per combination, as the renderer draws them ----------------------------------


def test_one_frame_per_combination_as_the_renderer_draws_it(small):
    stack = small.pictures["recall"]
    frames = [bytes(leaf.value) for leaf in images(stack)]
    assert len(frames) == len(N_PAIRS) * len(ALPHAS)
    assert all(f.startswith(PNG_MAGIC) for f in frames)
    assert len(set(frames)) == len(frames)  # no two alike
    for i, n in enumerate(N_PAIRS):
        expected = _recall_frames(small.curves[n], n, ALPHAS, D, max(N_PAIRS))
        assert [bytes(leaf.value) for leaf in stack.children[i].children] == expected


def _purple_rows(png: bytes) -> np.ndarray:
    """The rows of a frame where Gated DeltaNet's colour appears (its curves, its legend)."""
    rgb = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(float)  # (h, w, 3)
    purple = np.array(to_rgb(PURPLE)) * 255
    return np.flatnonzero((np.abs(rgb - purple).max(-1) < 20).sum(1) > 0)


def test_the_gated_curve_falls_as_alpha_falls(small):
    """Read back from the pixels: at 8 pairs the lowest point of the gated accuracy curve (the
    largest pixel row of its colour in the upper panel) lies lower the smaller α is, as its
    lowest accuracy does."""
    frames = small.pictures["recall"].children[1].children  # N = 8
    height = Image.open(io.BytesIO(bytes(frames[0].value))).size[1]
    lowest = []
    for leaf in frames:
        rows = _purple_rows(bytes(leaf.value))
        lowest.append(rows[rows < height * 0.45].max())  # the accuracy panel (legend below)
    worst = small.curves[8]["accuracy"]["gated delta rule"].min(-1)  # (A,)
    assert (np.diff(worst) > 0).all() and (np.diff(lowest) < 0).all()
    assert lowest[0] > lowest[-1] + 20  # α = 0.5 reaches far lower on the picture


def test_every_stack_is_jslinked_to_its_control(small):
    c = small.controls
    assert len(small.links) == 3 * (1 + len(N_PAIRS))  # wide and narrow pictures, texts
    for name in ("recall", "text"):
        stack = small.pictures[name]
        inner = list(stack.children)
        assert all(isinstance(s, widgets.Stack) for s in [stack, *inner])
        for s, control in [(stack, c["n"]), *((s, c["alpha"]) for s in inner)]:
            found = [link for link in small.links if link.target == (s, "selected_index")]
            assert len(found) == 1 and found[0].source == (control, "index")
        assert (stack.selected_index, inner[0].selected_index) == (1, 1)  # n = 8, α = 0.9


def test_every_frame_has_its_text_alternative(small):
    for i, n in enumerate(N_PAIRS):
        for a, alpha in enumerate(ALPHAS):
            leaf = small.pictures["text"].children[i].children[a]
            linear = small.curves[n]["accuracy"]["linear attention"]
            gated_error = small.curves[n]["error"]["gated delta rule"][a]
            assert leaf.value.startswith(f"{n} pairs in a {D} × {D} state, forget gate "
                                           f"α = {alpha:g}.")
            assert f"linear attention {linear[0]:.0%} to {linear[-1]:.0%}" in leaf.value
            assert f"Gated DeltaNet {gated_error[-1]:.2f}." in leaf.value


# Controls, kernel path, arguments, weight ----------------------------------------------------


def test_controls_are_sliders_that_wrap_and_start_mid_range(default):
    """Two SelectionSliders with accessible names, in one wrapping row, starting at N = 64 and
    α = 0.95 (the chapter's setting), with room to move right for the keyboard test."""
    c = default.controls
    assert list(c) == ["n", "alpha"]
    assert [v for _, v in c["n"].options] == [8, 16, 32, 64, 128]
    assert [v for _, v in c["alpha"].options] == [0.5, 0.8, 0.9, 0.95, 0.99, 1.0]
    assert (c["n"].value, c["alpha"].value) == (64, 0.95)
    row = next(w for w in every_widget(default) if isinstance(w, widgets.Box)
               and c["n"] in w.children)
    assert list(row.children) == [c["n"], c["alpha"]] and row.layout.flex_flow == "row wrap"
    for control in c.values():
        assert isinstance(control, widgets.SelectionSlider)
        assert control.description and control.style.description_width == "80px"
        assert control.layout.flex == f"1 1 {W.CONTROL_WIDTH}"
        assert control.layout.max_width == W.CONTROL_MAX_WIDTH
        assert control.index < len(control.options) - 1
    assert isinstance(default, W.RecallExplorer) and isinstance(default, W.Explorer)
    assert set(default.pictures) == {"recall", "text"}


def test_kernel_path_moves_the_picture_for_each_control(monkeypatch, small):
    """Without Stack (ipywidgets 7, Colab): one Image, no links, and each control moves it to
    the frame the Stacks would show; its text alternative follows where Image has one."""
    monkeypatch.setattr(W.frames, "HAS_STACK", False)
    box = _small()
    picture = box.pictures["recall"]
    assert isinstance(picture, widgets.Image) and box.links == []
    assert not any(isinstance(w, (widgets.Stack, Link)) for w in every_widget(box))
    static = small.pictures["recall"]
    for name, index in [("n", 2), ("alpha", 0), ("n", 0), ("alpha", 2)]:
        before = bytes(picture.value)
        box.controls[name].index = index
        assert bytes(picture.value) != before, f"moving {name} changed no picture"
        i, a = box.controls["n"].index, box.controls["alpha"].index
        leaf = static.children[i].children[a]
        assert bytes(picture.value) == bytes(leaf.value)
        text = small.pictures["text"].children[i].children[a]
        assert box.pictures["text"].value == text.value


def test_bad_arguments_name_their_values():
    with pytest.raises(ValueError, match=r"n_pairs .* got \[8, 4\]"):
        _small(n_pairs=(8, 4))
    with pytest.raises(ValueError, match=r"n_pairs .* got \[1, 8\]"):
        _small(n_pairs=(1, 8))
    with pytest.raises(ValueError, match=r"alphas .* got \[0.0, 0.9\]"):
        _small(alphas=(0.0, 0.9))
    with pytest.raises(ValueError, match=r"alphas .* got \[0.9, 1.5\]"):
        _small(alphas=(0.9, 1.5))
    with pytest.raises(ValueError, match=r"d_state \(0\) and trials \(30\)"):
        _small(d_state=0)
    with pytest.raises(ValueError, match=r"n \(5\) must be one of n_pairs \[4, 8, 16\]"):
        _small(n=5)
    with pytest.raises(ValueError, match=r"alpha \(0.95\) must be one of alphas \[0.5, 0.9, 1.0\]"):
        _small(alpha=0.95)
    many = tuple(range(2, 202))
    with pytest.raises(ValueError, match=r"200 N × 4 α = 800 frames"):
        _small(n_pairs=many, alphas=(0.25, 0.5, 0.75, 1.0), n=8, alpha=0.5)


def test_page_weight_and_frame_size(default):
    """The chapter's explorer (5 N × 6 α) adds under 1.5 MB of base64 PNG to its page, its
    frames as wide as the content column."""
    frames = [bytes(leaf.value) for leaf in images(default.pictures["recall"])]
    assert len(frames) == 30
    weight = sum(map(len, frames)) * 4 / 3
    assert weight < 1.5e6, f"the explorer adds {weight / 1e6:.2f} MB"
    width, height = Image.open(io.BytesIO(frames[0])).size
    assert width == W.FRAME_WIDTH * W.DPI and 450 <= height <= 650
