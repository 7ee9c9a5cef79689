import io
import math

import ipywidgets as widgets
import numpy as np
import pytest
import torch
from ipywidgets.widgets.widget_link import Link
from matplotlib.colors import to_rgb
from PIL import Image
from widget_support import every_widget, images, stacks_by_depth

from transformer_lib import widgets as W
from transformer_lib.plotting.style import BLUE, VERMILLION
from transformer_lib.widgets.softmax import _softmax_frames, _softmax_table, _softmax_texts

# Draws figures or explorer frames, seconds of CPU each: `make test` runs them, `make check` not.
pytestmark = pytest.mark.figures

DIMS, N_KEYS, SEED = (1, 4, 16, 64, 256, 1024), 8, 0
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _pixels_near(png: bytes, colour: str, within: float = 10.0) -> int:
    """How many pixels of ``png`` lie within ``within`` (RGB units, 0-255) of ``colour``."""
    rgb = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).reshape(-1, 3).astype(float)
    target = np.array(to_rgb(colour)) * 255
    return int((np.linalg.norm(rgb - target, axis=1) < within).sum())


@pytest.fixture(scope="module")
def explorer():
    return W.softmax_explorer(dims=DIMS, n_keys=N_KEYS, seed=SEED)


def _reference(z: torch.Tensor, d: int, scaled: bool):
    """Scores, weights and the largest |∂p_i/∂s_j| at width d, written out here: the weights
    with NumPy, the Jacobian by PyTorch's automatic differentiation of its own softmax."""
    scores = z.double().numpy() * (1.0 if scaled else math.sqrt(d))  # (S,)
    e = np.exp(scores - scores.max())
    weights = e / e.sum()
    jacobian = torch.autograd.functional.jacobian(
        lambda s: torch.softmax(s, dim=-1), torch.tensor(scores))  # (S, S): J[i, j] = dp_i/ds_j
    return scores, weights, float(jacobian.abs().max())


def test_softmax_explorer_has_one_frame_per_combination(explorer):
    frames = images(explorer.pictures["softmax"])
    assert len(frames) == len(W.SCALINGS) * len(DIMS) == 12
    values = [bytes(f.value) for f in frames]  # Image.value is a memoryview
    assert all(v.startswith(PNG_MAGIC) for v in values)
    assert len(set(values)) == len(values)  # no two frames alike


def _links_of(stack, links):
    stacks = [s for group in stacks_by_depth(stack).values() for s in group]
    return [link for link in links if any(link.target == (s, "selected_index") for s in stacks)]


@pytest.mark.parametrize("name", ["softmax", "text"])
def test_softmax_explorer_every_stack_is_jslinked_to_its_control(explorer, name):
    c = explorer.controls
    controls = [(c["scale"], "index"), (c["d_k"], "index")]
    stack = explorer.pictures[name]
    links = _links_of(stack, explorer.links)
    by_depth = stacks_by_depth(stack)
    assert len(by_depth) == len(controls)
    assert len(links) == sum(len(stacks) for stacks in by_depth.values()) == 1 + 2
    assert len(explorer.links) == 3 * len(links)  # the picture's (wide, narrow) and the text's
    for depth, stacks in by_depth.items():
        for s in stacks:
            found = [link for link in links if link.target == (s, "selected_index")]
            assert len(found) == 1 and found[0].source == controls[depth]


def test_softmax_explorer_text_gives_each_frames_numbers(explorer):
    """Under the picture, the text alternative of each frame: the same frame's numbers,
    computed here, in words."""
    texts = explorer.pictures["text"]
    for s, how in enumerate(("not scaled", "divided by √d<sub>k</sub>")):
        shown = [leaf.value for leaf in texts.children[s].children]
        assert len(shown) == len(DIMS) and len(set(shown)) == len(DIMS)
        assert shown == _softmax_texts(explorer.z, DIMS, bool(s))
        for j, d in enumerate(DIMS):
            scores, weights, largest = _reference(explorer.z, d, bool(s))
            assert shown[j].startswith(f"d<sub>k</sub> = {d}, scores {how}: spread "
                                       f"{scores.std(ddof=1):.2f}")
            assert f"largest weight {weights.max():.3f} (key {weights.argmax()})" in shown[j]
            assert f"Jacobian {largest:.1e}" in shown[j]
    assert all(isinstance(leaf, widgets.HTML) for leaf in every_widget(texts)
               if not isinstance(leaf, widgets.Stack))


@pytest.mark.parametrize("scaled", [False, True])
def test_softmax_explorer_frames_are_those_of_the_renderer(explorer, scaled):
    """The frames under scale index s are the renderer's frames for that scaling, one per
    width in order, drawn from the explorer's own row z (seeded: the same as a fresh draw)."""
    torch.testing.assert_close(explorer.z, torch.randn(N_KEYS, generator=torch.Generator()
                                                       .manual_seed(SEED)))
    shown = [bytes(leaf.value) for leaf in
             explorer.pictures["softmax"].children[int(scaled)].children]
    assert shown == _softmax_frames(explorer.z, DIMS, scaled)


@pytest.mark.parametrize("scaled", [False, True])
def test_softmax_table_matches_a_written_out_softmax_and_autograd(scaled):
    z = torch.randn(5, generator=torch.Generator().manual_seed(7))
    scores, weights, largest = _softmax_table(z, DIMS, scaled)
    assert scores.dtype == torch.float64 and scores.shape == weights.shape == (len(DIMS), 5)
    for j, d in enumerate(DIMS):
        ref_scores, ref_weights, ref_largest = _reference(z, d, scaled)
        np.testing.assert_allclose(scores[j].numpy(), ref_scores, rtol=1e-12, atol=0)
        np.testing.assert_allclose(weights[j].numpy(), ref_weights, rtol=1e-12, atol=1e-300)
        assert math.isclose(float(largest[j]), ref_largest, rel_tol=1e-9)


def test_softmax_table_shows_saturation_without_the_scale_only(explorer):
    """Unscaled, the spread of the row grows like √d_k, its largest weight climbs to 1 and its
    largest gradient falls by orders of magnitude; scaled, the row is the same at every width.
    The numbers are those the chapter's sentence quotes."""
    scores, weights, largest = _softmax_table(explorer.z, DIMS, False)
    spread = scores.std(dim=-1)  # (n,)
    np.testing.assert_allclose((spread / spread[0]).numpy(), np.sqrt(DIMS), rtol=1e-12)
    top = weights.amax(dim=-1)
    assert (top.diff() > 0).all() and round(float(top[0]), 3) == 0.400 and top[-1] > 1 - 1e-9
    assert (largest.diff() < 0).all() and 1.5e-10 < largest[-1] < 1.9e-10
    assert round(float(largest[0]), 2) == 0.24
    s_scores, s_weights, s_largest = _softmax_table(explorer.z, DIMS, True)
    torch.testing.assert_close(s_scores, s_scores[:1].expand_as(s_scores), rtol=0, atol=0)
    torch.testing.assert_close(s_weights[0], weights[0], rtol=1e-15, atol=0)  # d_k = 1: √1 = 1
    assert (s_largest == largest[0]).all() and (s_largest <= 0.25).all()


def test_softmax_frames_draw_each_scaling_in_its_colour(explorer):
    """The bars and the marked point take the scaling's colour: vermillion unscaled, blue
    scaled (the other colour only in its faint curve and legend)."""
    stack = explorer.pictures["softmax"]
    for j in (0, 3, 5):
        unscaled = bytes(stack.children[0].children[j].value)
        scaled = bytes(stack.children[1].children[j].value)
        assert _pixels_near(unscaled, VERMILLION) > 1000 > _pixels_near(unscaled, BLUE)
        assert _pixels_near(scaled, BLUE) > 1000 > _pixels_near(scaled, VERMILLION)


def _bar_pixels(png: bytes, colour: str) -> np.ndarray:
    """How many pixels of the bars' colour each column of the weights panel (the lower left
    quarter of the frame) holds: ``(w/2,)``."""
    rgb = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(float)  # (h, w, 3)
    h, w, _ = rgb.shape
    target = np.array(to_rgb(colour)) * 255
    return (np.linalg.norm(rgb - target, axis=-1)[h // 2:, : w // 2] < 10).sum(axis=0)


def test_softmax_frames_show_the_weights_computed_here(explorer):
    """Read back from the pixels, the weight bars of a frame are the softmax of that frame's
    row, computed here: each key's bar (where d_k = 1 draws it: every weight is visible
    there) is as tall as its weight, a weight of 1 being the single bar of d_k = 1024
    unscaled."""
    stack = explorer.pictures["softmax"]
    full = _bar_pixels(bytes(stack.children[0].children[5].value), VERMILLION).max()
    assert full > 100
    for s, colour in enumerate((VERMILLION, BLUE)):
        columns = np.flatnonzero(_bar_pixels(bytes(stack.children[s].children[0].value), colour))
        keys = np.split(columns, np.flatnonzero(np.diff(columns) > 1) + 1)  # columns per bar
        assert len(keys) == N_KEYS
        for j in (0, 2, 3, 5):
            _, weights, _ = _reference(explorer.z, DIMS[j], bool(s))
            counts = _bar_pixels(bytes(stack.children[s].children[j].value), colour)
            heights = np.array([counts[key].max() for key in keys])  # (S,) pixels
            np.testing.assert_allclose(heights / full, weights, atol=2 / full)
            assert counts.sum() == sum(counts[key].sum() for key in keys)  # no other bars


def test_softmax_explorer_controls_wrap_and_move_by_keyboard(explorer):
    c = explorer.controls
    assert list(c) == ["d_k", "scale"]
    assert isinstance(c["d_k"], widgets.SelectionSlider)
    assert [d for _, d in c["d_k"].options] == list(DIMS) and c["d_k"].index == 0
    assert isinstance(c["scale"], widgets.Dropdown) and c["scale"].index == 0
    assert [label for label, _ in c["scale"].options] == list(W.SCALINGS) == ["none", "÷ √d_k"]
    row = next(w for w in every_widget(explorer) if isinstance(w, widgets.Box)
               and c["d_k"] in w.children)
    assert list(row.children) == list(c.values()) and row.layout.flex_flow == "row wrap"
    for control in c.values():
        assert control.layout.flex == f"1 1 {W.CONTROL_WIDTH}" and control.layout.min_width == "0"
        assert control.layout.max_width == W.CONTROL_MAX_WIDTH
        assert control.description and control.style.description_width == "80px"
    assert not any(isinstance(w, widgets.ToggleButtons) for w in every_widget(explorer))


def test_softmax_explorer_is_a_typed_widget_whose_pictures_scale(explorer):
    assert isinstance(explorer, W.SoftmaxExplorer) and isinstance(explorer, W.Explorer)
    assert set(explorer.pictures) == {"softmax", "text"} and explorer.dims == DIMS
    shown = every_widget(explorer)
    assert all(any(p is w for w in shown) for p in explorer.pictures.values())
    frames = images(explorer.pictures["softmax"])
    assert len({id(leaf.layout) for leaf in frames}) == 1
    for leaf in frames:
        width, height = Image.open(io.BytesIO(bytes(leaf.value))).size
        assert leaf.layout.width == "100%" and leaf.layout.max_width == f"{width}px"
        assert 700 <= width <= W.FRAME_WIDTH * W.DPI and 400 <= height <= 500


def test_softmax_explorer_page_weight(explorer):
    """What the pictures add to chapter 1, as base64 in its widget state: under 1.5 MB."""
    weight = sum(len(leaf.value) for leaf in images(explorer.pictures["softmax"])) * 4 / 3
    assert weight < 1.5e6, f"the softmax explorer would add {weight / 1e6:.2f} MB"


def test_softmax_explorer_rejects_bad_arguments():
    with pytest.raises(ValueError, match=r"increasing positive integers, got \(4,\)"):
        W.softmax_explorer(dims=(4,))
    with pytest.raises(ValueError, match=r"got \(4, 4\)"):
        W.softmax_explorer(dims=(4, 4))
    with pytest.raises(ValueError, match=r"got \(0, 4\)"):
        W.softmax_explorer(dims=(0, 4))
    with pytest.raises(ValueError, match=r"got \(1, 2.5\)"):
        W.softmax_explorer(dims=(1, 2.5))
    with pytest.raises(ValueError, match=r"n_keys must be >= 2, got 1"):
        W.softmax_explorer(n_keys=1)
    with pytest.raises(ValueError, match=r"2 scalings × 301 widths = 602 frames"):
        W.softmax_explorer(dims=range(1, 302))


# Without Stack (ipywidgets 7, Colab): one picture, updated through the kernel ----------------


def test_kernel_path_softmax_explorer_follows_each_control(monkeypatch, explorer):
    monkeypatch.setattr(W.frames, "HAS_STACK", False)
    box = W.softmax_explorer(dims=DIMS, n_keys=N_KEYS, seed=SEED)
    found = every_widget(box) + list(box.links)
    assert not any(isinstance(w, (widgets.Stack, Link)) for w in found) and box.links == []
    picture, text, c = box.pictures["softmax"], box.pictures["text"], box.controls
    stacks, texts = explorer.pictures["softmax"], explorer.pictures["text"]
    assert isinstance(picture, widgets.Image) and isinstance(text, widgets.HTML)
    for name, index in [("d_k", 3), ("scale", 1), ("d_k", 5), ("scale", 0)]:
        before = bytes(picture.value)
        c[name].index = index
        assert bytes(picture.value) != before, f"moving {name} changed no picture"
        static = stacks.children[c["scale"].index].children[c["d_k"].index]
        assert bytes(picture.value) == bytes(static.value)
        assert text.value == texts.children[c["scale"].index].children[c["d_k"].index].value
