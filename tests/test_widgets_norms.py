"""The gradient-profile explorer of chapter 4 (``transformer_lib.widgets.norms``)."""
import copy
import importlib.util
import io
import random
from pathlib import Path

import ipywidgets as widgets
import numpy as np
import pytest
import torch
from ipywidgets.embed import dependency_state, embed_data
from ipywidgets.widgets.widget_link import Link
from matplotlib.colors import to_rgb
from PIL import Image
from widget_support import every_widget, images, stacks_by_depth

from transformer_lib import widgets as W
from transformer_lib.encoder_decoder import EncoderDecoder, LabelSmoothingLoss
from transformer_lib.tasks import reversal_batch, reversal_config
from transformer_lib.widgets.norms import PLACEMENTS, STACKS, STYLES, _gradient_frames, _y_limits

# Draws figures or explorer frames, seconds of CPU each: `make test` runs them, `make check` not.
pytestmark = pytest.mark.figures

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
DEPTHS = [2, 4, 6, 8, 12, 16]


@pytest.fixture(scope="module")
def data():
    return W.load_gradient_profile()


@pytest.fixture(scope="module")
def explorer():
    return W.gradient_explorer()


def _measure(depth: int, norm_first: bool, seed: int) -> dict[str, np.ndarray]:
    """The chapter's measurement written out again: one batch through a fresh model."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    config = reversal_config(n_layers=depth, norm_first=norm_first, final_norm=norm_first)
    model = EncoderDecoder(config)
    src, tgt_in, tgt_out = reversal_batch(32, 8, config.tgt_vocab_size,
                                          torch.Generator().manual_seed(seed))
    LabelSmoothingLoss(0.1)(model(src, tgt_in), tgt_out).backward()
    out = {}
    for stack in STACKS:
        layers = getattr(model, stack).layers
        out[stack] = np.array([np.sqrt(sum(float((p.grad.double() ** 2).sum())
                                           for p in layer.parameters())) for layer in layers])
    return out


@pytest.mark.parametrize("depth, seed", [(2, 0), (4, 3)])
def test_bundled_profiles_are_a_fresh_measurement(data, depth, seed):
    """The shipped numbers are what one batch through a fresh model gives now, for both
    placements and both stacks (fp32 gradients: 1e-4 relative between machines)."""
    assert data["settings"]["depths"] == DEPTHS and data["settings"]["seeds"] == [0, 1, 2, 3, 4]
    for placement in PLACEMENTS:
        fresh = _measure(depth, placement == "pre-norm", seed)
        for stack in STACKS:
            shipped = np.array(data["profiles"][placement][stack][str(depth)][seed])
            np.testing.assert_allclose(shipped, fresh[stack], rtol=1e-4)


def test_the_bench_script_writes_what_the_explorer_reads(data):
    """bench/gradient_profile.py sweeps the shipped depths and seeds and measures what the
    file holds."""
    script = Path(__file__).resolve().parent.parent / "bench" / "gradient_profile.py"
    spec = importlib.util.spec_from_file_location("gradient_bench", script)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert list(bench.DEPTHS) == data["settings"]["depths"]
    assert list(bench.SEEDS) == data["settings"]["seeds"]
    assert bench.OUT.name == W.GRADIENT_PROFILE_FILE and data["command"].endswith(script.name)
    measured = bench.layer_gradients(2, True, 1)
    for stack in STACKS:
        np.testing.assert_allclose(measured[stack],
                                   data["profiles"]["pre-norm"][stack]["2"][1], rtol=1e-4)


def test_profiles_show_what_the_chapter_says(explorer):
    """The post-norm decoder's layer 1 gets a smaller share of the top layer's gradient the
    deeper the stack; the pre-norm decoder's stays within a small factor at every depth."""
    post = [W.norms.first_over_last(explorer.profiles["post-norm"]["decoder"][d]) for d in DEPTHS]
    pre = [W.norms.first_over_last(explorer.profiles["pre-norm"]["decoder"][d]) for d in DEPTHS]
    assert all(a > b for a, b in zip(post, post[1:])) and post[-1] < 0.01 < 0.5 < post[0]
    assert all(0.5 < r < 4 for r in pre)
    norms = np.array([[3.0, 1.0], [5.0, 2.0], [1.0, 1.0]])  # (seeds, depth)
    assert W.norms.first_over_last(norms) == 2.5  # median of 3, 2.5, 1


def test_one_frame_per_stack_and_depth(explorer):
    frames = images(explorer.pictures["profile"])
    assert len(frames) == len(STACKS) * len(DEPTHS)
    values = [bytes(f.value) for f in frames]
    assert all(v.startswith(PNG_MAGIC) for v in values)
    assert len(set(values)) == len(values)
    assert explorer.depths == DEPTHS
    assert [d for _, d in explorer.controls["depth"].options] == DEPTHS
    assert explorer.controls["depth"].value == 8  # the chapter's figure first
    assert [name for name, _ in explorer.controls["stack"].options] == list(STACKS)


@pytest.mark.parametrize("s, k", [(0, 0), (0, 3), (1, 5)])
def test_frame_at_indices_is_the_renderers_frame_for_that_combination(explorer, data, s, k):
    """The leaf under stack s, depth index k is the frame the renderer draws for them, from
    the numbers in the bundled file."""
    stack, depth = STACKS[s], DEPTHS[k]
    for placement in PLACEMENTS:
        np.testing.assert_array_equal(explorer.profiles[placement][stack][depth],
                                      np.array(data["profiles"][placement][stack][str(depth)]))
    leaf = explorer.pictures["profile"].children[s].children[k]
    expected = _gradient_frames(explorer.profiles, stack, DEPTHS, _y_limits(explorer.profiles))
    assert bytes(leaf.value) == expected[k]


def _synthetic(post: float = 8.0, pre: float = 0.5) -> dict:
    """Profiles where every layer of every model has the same gradient norm."""
    return {"profiles": {
        placement: {stack: {str(d): [[value] * d, [value] * d] for d in DEPTHS}
                    for stack in STACKS}
        for placement, value in (("post-norm", post), ("pre-norm", pre))}}


def _near(png: bytes, colour: str, within: float = 40.0) -> np.ndarray:
    rgb = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(float)  # (h, w, 3)
    return np.linalg.norm(rgb - np.array(to_rgb(colour)) * 255, axis=-1) < within  # (h, w)


def test_frames_draw_as_many_layers_as_the_depth():
    """With every norm equal, the post-norm curve is a flat row in the top of the picture
    whose right end moves right in proportion to the depth: frame k draws depths[k] layers
    on an x axis shared by every frame."""
    box = W.gradient_explorer(_synthetic())
    ends, rows = [], []
    for leaf in box.pictures["profile"].children[0].children:  # decoder, every depth
        orange = _near(bytes(leaf.value), STYLES["post-norm"]["color"])
        top = orange[: orange.shape[0] // 2]  # the legend sits in the lower right
        ys, xs = np.nonzero(top)
        ends.append(xs.max())
        rows.append(np.median(ys))
    slope, intercept = np.polyfit(DEPTHS, ends, 1)
    assert slope > 10 and np.abs(np.polyval((slope, intercept), DEPTHS) - ends).max() < 3
    assert max(rows) - min(rows) <= 1  # the y axis does not move between frames


def test_every_stack_is_jslinked_to_its_control(explorer):
    c = explorer.controls
    stack = explorer.pictures["profile"]
    by_depth = stacks_by_depth(stack)
    controls = [(c["stack"], "index"), (c["depth"], "index")]
    assert len(by_depth) == 2 and len(explorer.links) == 2 * (1 + len(STACKS))  # and narrow
    for depth, stacks in by_depth.items():
        for s in stacks:
            found = [link for link in explorer.links if link.target == (s, "selected_index")]
            assert len(found) == 1 and found[0].source == controls[depth]
    assert stack.selected_index == 0 and stack.children[0].selected_index == DEPTHS.index(8)


def test_controls_wrap_and_move_by_keyboard(explorer):
    controls = list(explorer.controls.values())
    row = next(w for w in every_widget(explorer) if isinstance(w, widgets.Box)
               and controls[0] in w.children)
    assert list(row.children) == controls and row.layout.flex_flow == "row wrap"
    for control in controls:
        assert isinstance(control, (widgets.SelectionSlider, widgets.Dropdown))
        assert control.layout.flex == f"1 1 {W.CONTROL_WIDTH}"
        assert control.layout.max_width == W.CONTROL_MAX_WIDTH
        assert control.description and control.style.description_width == "80px"
    # ArrowRight must have somewhere to go from the first setting of each control.
    assert explorer.controls["depth"].index < len(DEPTHS) - 1
    assert explorer.controls["stack"].index < len(STACKS) - 1
    assert isinstance(explorer, W.GradientExplorer) and isinstance(explorer, W.Explorer)
    assert set(explorer.pictures) == {"profile"}


def test_frames_fit_the_column_and_the_page_weight(explorer):
    """Each frame fills the content column at most; the pictures add well under 1.5 MB to
    the page as base64 in its widget state."""
    frames = [bytes(f.value) for f in images(explorer.pictures["profile"])]
    for png in frames:
        width, height = Image.open(io.BytesIO(png)).size
        assert 600 <= width <= W.FRAME_WIDTH * W.DPI and 300 <= height <= 500
    assert sum(map(len, frames)) * 4 / 3 < 1.5e6
    state = embed_data(views=[explorer], state=dependency_state(explorer))["manager_state"]["state"]
    embedded = sum(len(b["data"]) for s in state.values() for b in s.get("buffers", []))
    assert embedded < 1.5e6


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match=r"depth must be one of .*\[2, 4, 6, 8, 12, 16\], got 5"):
        W.gradient_explorer(depth=5)
    bad = _synthetic()
    del bad["profiles"]["pre-norm"]
    with pytest.raises(ValueError, match=r"placements \('post-norm', 'pre-norm'\), got \['post"):
        W.gradient_explorer(bad)
    bad = _synthetic()
    bad["profiles"]["post-norm"]["encoder"]["4"] = [[1.0, 1.0, 1.0]]
    with pytest.raises(ValueError, match=r"post-norm encoder depth 4: expected \(seeds, 4\)"):
        W.gradient_explorer(bad)
    bad = _synthetic()
    del bad["profiles"]["pre-norm"]["decoder"]["16"]
    with pytest.raises(ValueError, match=r"pre-norm decoder has \[2, 4, 6, 8, 12\]"):
        W.gradient_explorer(bad)
    bad = copy.deepcopy(_synthetic())
    bad["profiles"]["pre-norm"]["decoder"]["2"][0][1] = 0.0
    with pytest.raises(ValueError, match=r"pre-norm decoder depth 2: .* > 0"):
        W.gradient_explorer(bad)
    with pytest.raises(ValueError, match=r"got NoneType"):
        W.gradient_explorer({"profiles": None})


# Without Stack (ipywidgets 7, Colab): one picture, updated through the kernel ----------------


@pytest.fixture
def kernel_path(monkeypatch):
    monkeypatch.setattr(W.frames, "HAS_STACK", False)


def test_kernel_path_moves_the_picture_for_each_control(kernel_path, explorer):
    """Each control moves the one picture to the frame the static book's Stacks show for the
    same setting; no Stack and no link."""
    box = W.gradient_explorer()
    picture, stacks = box.pictures["profile"], explorer.pictures["profile"]
    assert isinstance(picture, widgets.Image) and box.links == []
    assert not any(isinstance(w, (widgets.Stack, Link)) for w in every_widget(box))
    for name, index in [("depth", 5), ("stack", 1), ("depth", 0)]:
        before = bytes(picture.value)
        box.controls[name].index = index
        assert bytes(picture.value) != before, f"moving {name} changed no picture"
        s, k = box.controls["stack"].index, box.controls["depth"].index
        assert bytes(picture.value) == bytes(stacks.children[s].children[k].value)
