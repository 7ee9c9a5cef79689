"""The online-softmax explorer (chapter 8): its numbers against the softmax and the library's
tiled attention, its frames against the renderer, its links, its kernel path, its weight."""
import io

import ipywidgets as widgets
import numpy as np
import pytest
import torch
from ipywidgets.embed import dependency_state, embed_data
from ipywidgets.widgets.widget_link import Link
from matplotlib.colors import to_rgb
from PIL import Image
from widget_support import every_widget, images

from transformer_lib import widgets as W
from transformer_lib.flash import flash_attention
from transformer_lib.plotting.style import BLUE, ORANGE
from transformer_lib.widgets.online_softmax import (
    _example_row,
    _online_softmax_frames,
    _online_softmax_steps,
)

# Draws figures or explorer frames, seconds of CPU each: `make test` runs them, `make check` not.
pytestmark = pytest.mark.figures

N_KEYS, TILES, SEED = 10, (2, 4), 3  # the small explorer: 2 tile sizes × 6 steps
N_STEPS = 10 // 2 + 1


@pytest.fixture(scope="module")
def small():
    return W.online_softmax_explorer(n_keys=N_KEYS, tile_sizes=TILES, seed=SEED)


@pytest.fixture(scope="module")
def default():
    return W.online_softmax_explorer()


def _rows():
    """Rows of scores and values, some with scores around 100 (exp overflows in float32)."""
    rng = np.random.default_rng(7)
    for n, shift in ((1, 0.0), (7, 0.0), (24, 0.0), (30, 100.0), (13, -50.0)):
        yield 3 * rng.standard_normal(n) + shift, rng.standard_normal(n)


# The numbers: an fp64 online softmax, checked against the whole-row softmax ------------------


@pytest.mark.parametrize("tile", [1, 3, 4, 8, 64])
def test_every_step_is_the_softmax_of_the_keys_read_so_far(tile):
    """After each tile, m is the largest score read, ℓ the sum of exp(s − m) over the keys
    read, and a / ℓ equals softmax(scores read) · values read (torch, float64); the last step
    is the whole row's attention output, to fp64 rounding. The tile may not divide S."""
    for scores, values in _rows():
        steps = _online_softmax_steps(scores, values, tile)
        S = len(scores)
        assert list(steps.end) == [0, *range(min(tile, S), S, tile), S][:len(steps.end)]
        assert steps.end[-1] == S and len(steps.end) == -(-S // tile) + 1
        assert steps.m[0] == -np.inf and steps.l[0] == 0 and np.isnan(steps.out[0])
        s, v = torch.tensor(scores, dtype=torch.float64), torch.tensor(values, dtype=torch.float64)
        for t in range(1, len(steps.end)):
            end = int(steps.end[t])
            seen = s[:end]
            assert steps.m[t] == seen.max().item()
            np.testing.assert_allclose(steps.l[t], torch.exp(seen - seen.max()).sum().item(),
                                       rtol=1e-12)
            expected = (torch.softmax(seen, dim=0) @ v[:end]).item()
            np.testing.assert_allclose(steps.out[t], expected, rtol=1e-12, atol=1e-12)
            rescale = 0.0 if t == 1 else np.exp(steps.m[t - 1] - steps.m[t])
            assert steps.rescale[t] == pytest.approx(rescale, rel=1e-15, abs=0)
            assert steps.rescale[t] <= 1
        whole = (torch.softmax(s, dim=0) @ v).item()
        np.testing.assert_allclose(steps.out[-1], whole, rtol=1e-12, atol=1e-12)


def test_the_last_step_agrees_with_the_librarys_flash_attention():
    """One query of one channel with q = 1 and keys k_j = s_j has the scores s_j; the library's
    tiled attention with the same tile gives the same output and log-sum-exp m + log ℓ."""
    for scores, values in _rows():
        steps = _online_softmax_steps(scores, values, 4)
        q = torch.ones(1, 1, dtype=torch.float64)  # (T = 1, D = 1)
        k = torch.tensor(scores, dtype=torch.float64)[:, None]  # (S, 1)
        v = torch.tensor(values, dtype=torch.float64)[:, None]  # (S, 1)
        out, lse = flash_attention(q, k, v, block_size=4, return_lse=True)
        np.testing.assert_allclose(steps.out[-1], out.item(), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(steps.m[-1] + np.log(steps.l[-1]), lse.item(), rtol=1e-12)


def test_a_step_that_raises_the_maximum_rescales_the_old_sums():
    scores, values = np.array([0.0, 1.0, 3.0, 2.0]), np.array([1.0, -1.0, 2.0, 0.5])
    steps = _online_softmax_steps(scores, values, 2)
    assert list(steps.m[1:]) == [1.0, 3.0]
    assert steps.rescale[2] == pytest.approx(np.exp(1.0 - 3.0), rel=1e-15)
    np.testing.assert_allclose(steps.l[2], np.exp(-3.0) + np.exp(-2.0) + 1 + np.exp(-1.0),
                               rtol=1e-15)


# The explorer: one frame per combination, the renderer's frames, links -------------------


def test_one_frame_per_combination_drawn_by_the_renderer(small):
    """Frames [tile][k] are what the renderer draws for that tile size, k = 0 … ceil(S/2);
    all different (a step past a tile size's last tile says so in its title)."""
    stack = small.pictures["online"]
    assert small.tile_sizes == TILES and len(stack.children) == len(TILES)
    frames = [bytes(leaf.value) for leaf in images(stack)]
    assert len(frames) == len(TILES) * N_STEPS and len(set(frames)) == len(frames)
    for b, tile in enumerate(TILES):
        expected = _online_softmax_frames(small.scores, small.values, tile, N_STEPS)
        assert [bytes(leaf.value) for leaf in stack.children[b].children] == expected
    scores, values = _example_row(N_KEYS, SEED)
    np.testing.assert_array_equal(small.scores, scores)
    assert not np.allclose(W.online_softmax_explorer(n_keys=N_KEYS, tile_sizes=(2,),
                                                     seed=SEED + 1).scores, scores)


def _coloured_extent(png: bytes) -> int:
    """The rightmost pixel column drawn in the palette's blue or orange (the keys read)."""
    rgb = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(float)  # (h, w, 3)
    near = [np.linalg.norm(rgb - np.array(to_rgb(c)) * 255, axis=-1) < 10 for c in (BLUE, ORANGE)]
    columns = np.flatnonzero((near[0] | near[1]).any(axis=0))
    return int(columns.max()) if len(columns) else -1


def test_frames_show_the_keys_read_so_far(small):
    """Step 0 draws no key as read; each later tile reaches further right; past the last tile
    of a size nothing more is read."""
    stack = small.pictures["online"]
    for b, tile in enumerate(TILES):
        extents = [_coloured_extent(bytes(leaf.value)) for leaf in stack.children[b].children]
        n_tiles = -(-N_KEYS // tile)
        assert extents[0] == -1
        assert all(x < y for x, y in zip(extents[:n_tiles], extents[1:n_tiles + 1]))
        assert len(set(extents[n_tiles:])) == 1


def test_every_stack_is_jslinked_to_its_control(small):
    c, stack = small.controls, small.pictures["online"]
    inner = list(stack.children)
    assert all(isinstance(s, widgets.Stack) for s in inner)
    assert len(small.links) == 2 * (1 + len(inner))  # the wide and the narrow frames
    outer = [link for link in small.links if link.target == (stack, "selected_index")]
    assert len(outer) == 1 and outer[0].source == (c["tile"], "index")
    for s in inner:
        found = [link for link in small.links if link.target == (s, "selected_index")]
        assert len(found) == 1 and found[0].source == (c["step"], "value")
    state = embed_data(views=[small])["manager_state"]["state"]
    link = state[outer[0].model_id]["state"]
    assert link["target"] == [f"IPY_MODEL_{stack.model_id}", "selected_index"]


def test_controls_wrap_start_where_the_arrow_keys_change_the_picture(small):
    """A slider for the tile size and one for the step, named, laid out like the other
    explorers', each starting below its maximum (ArrowRight must change the picture)."""
    c = small.controls
    assert list(c) == ["tile", "step"]
    assert isinstance(c["tile"], widgets.SelectionSlider) and isinstance(c["step"], widgets.IntSlider)
    assert [value for _, value in c["tile"].options] == list(TILES)
    assert (c["step"].min, c["step"].max, c["step"].value, c["tile"].index) == (0, N_STEPS - 1, 2, 0)
    row = next(w for w in every_widget(small) if isinstance(w, widgets.Box)
               and c["tile"] in w.children)
    assert list(row.children) == list(c.values()) and row.layout.flex_flow == "row wrap"
    for control in c.values():
        assert control.description and control.style.description_width == "80px"
        assert control.layout.flex == f"1 1 {W.CONTROL_WIDTH}"
        assert control.layout.max_width == W.CONTROL_MAX_WIDTH
    assert isinstance(small, W.OnlineSoftmaxExplorer) and isinstance(small, W.Explorer)
    assert "online softmax" in small.children[0].value  # the caption comes first


# Without Stack (ipywidgets 7, Colab): one picture, updated through the kernel ----------------


def test_kernel_path_moves_the_picture_with_each_control(monkeypatch, small):
    monkeypatch.setattr(W.frames, "HAS_STACK", False)
    box = W.online_softmax_explorer(n_keys=N_KEYS, tile_sizes=TILES, seed=SEED)
    picture, stacks = box.pictures["online"], small.pictures["online"]
    assert isinstance(picture, widgets.Image) and box.links == []
    assert not any(isinstance(w, (widgets.Stack, Link)) for w in every_widget(box))
    for name, value in [("step", 3), ("tile", 1), ("step", N_STEPS - 1), ("tile", 0)]:
        before = bytes(picture.value)
        if name == "tile":
            box.controls["tile"].index = value
        else:
            box.controls["step"].value = value
        assert bytes(picture.value) != before, f"moving {name} changed no picture"
        b, k = box.controls["tile"].index, box.controls["step"].value
        assert bytes(picture.value) == bytes(stacks.children[b].children[k].value)


# Arguments and weight --------------------------------------------------------------------------


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match=r"n_keys must be >= 2, got 1"):
        W.online_softmax_explorer(n_keys=1, tile_sizes=(1,))
    with pytest.raises(ValueError, match=r"distinct and not empty, got \(\)"):
        W.online_softmax_explorer(tile_sizes=())
    with pytest.raises(ValueError, match=r"got \(3, 3\)"):
        W.online_softmax_explorer(tile_sizes=(3, 3))
    with pytest.raises(ValueError, match=r"\[1, n_keys = 24\], got \[0, 30\]"):
        W.online_softmax_explorer(tile_sizes=(0, 4, 30))
    with pytest.raises(ValueError, match=r"= 2002 frames"):  # 2 tile sizes × 1001 steps
        W.online_softmax_explorer(n_keys=1000, tile_sizes=(1, 2))


def test_default_explorer_frames_and_page_weight(default):
    """The chapter's explorer: 3 tile sizes × 9 steps; what its frames add to the page as
    base64 in the widget state stays under 1.5 MB."""
    frames = [bytes(leaf.value) for leaf in images(default.pictures["online"])]
    assert len(frames) == 3 * 9 and default.tile_sizes == (3, 5, 8)
    state = embed_data(views=[default], state=dependency_state(default))["manager_state"]
    buffers = [b["data"] for s in state["state"].values() for b in s.get("buffers", [])]
    assert len(buffers) == 2 * len(frames)  # the wide and the narrow frames
    weight = sum(map(len, buffers))
    assert weight < 1.5e6, f"the explorer adds {weight / 1e6:.2f} MB"
    width, height = Image.open(io.BytesIO(frames[0])).size
    assert 300 <= width <= W.FRAME_WIDTH * W.DPI and height >= 300


def test_the_chapters_row_gives_the_numbers_its_prose_states():
    """Chapter 8 describes the default explorer's pictures: with tiles of 3 the maximum rises
    at tiles 3, 7 and 8 (factors 0.292, 0.333, 0.545), the partial output stays within
    [−0.48, −0.10] over six tiles, is 0.370 after the seventh and 0.372 (exact) after the
    last; tiles of 5 rescale three times, tiles of 8 once."""
    scores, values = _example_row(24, 0)
    steps = _online_softmax_steps(scores, values, 3)
    raised = [t for t in range(2, len(steps.end)) if steps.rescale[t] < 1]
    assert raised == [3, 7, 8]
    np.testing.assert_allclose(steps.rescale[raised], [0.292, 0.333, 0.545], atol=5e-4)
    assert -0.485 < steps.out[1:7].min() and steps.out[1:7].max() < -0.095
    assert round(steps.out[7], 3) == 0.370 and round(steps.out[8], 3) == 0.372
    for tile, n_rescales in ((5, 3), (8, 1)):
        other = _online_softmax_steps(scores, values, tile)
        assert sum(other.rescale[2:] < 1) == n_rescales
        np.testing.assert_allclose(other.out[-1], steps.out[-1], rtol=1e-12)
