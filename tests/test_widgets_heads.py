"""The heads explorer (chapter 3): its frames are what the bundled results say, the results are
what the chapter's own code trains, and it works with and without ``Stack``."""
import base64
import io
import json
from pathlib import Path

import ipywidgets as widgets
import numpy as np
import pytest
import torch
from ipywidgets.embed import dependency_state, embed_data
from ipywidgets.widgets.widget_link import Link
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from PIL import Image
from widget_support import every_widget, images, stacks_by_depth

from transformer_lib import widgets as W
from transformer_lib.plotting import WEIGHT_CMAP
from transformer_lib.widgets import heads as heads_module
from transformer_lib.widgets.heads import _heads_frames

# Draws figures or explorer frames, seconds of CPU each: `make test` runs them, `make check` not.
pytestmark = pytest.mark.figures

ROOT = Path(__file__).resolve().parent.parent
CHAPTER = ROOT / "chapters" / "03b_what_heads_learn.ipynb"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
HEADS, N_EXAMPLES = (1, 2, 4, 8), 6  # the defaults


@pytest.fixture(scope="module")
def data():
    return W.load_two_reads_heads()


@pytest.fixture(scope="module")
def explorer():
    return W.heads_explorer()


def _result(data, n_heads: int) -> dict:
    return next(r for r in data["results"] if r["n_heads"] == n_heads)


# The bundled results ------------------------------------------------------------------------


def test_bundled_results_are_complete_and_consistent(data):
    """Every head count has H rows of weights at the query for every stored example, each a
    distribution over the 8 positions, and the stored examples are test sequences whose two
    reads differ, their answers read off their keys and values."""
    ex = data["examples"]
    assert [r["n_heads"] for r in data["results"]] == list(HEADS)
    assert data["settings"]["C"] == 32 and data["command"] == "python bench/two_reads_heads.py"
    n, T = len(ex["keys"]), data["settings"]["positions"]
    assert n >= N_EXAMPLES and all(len(k) == T for k in ex["keys"])
    for e in range(n):
        keys, values, asked = ex["keys"][e], ex["values"][e], ex["asked"][e]
        assert asked != T - 2 and keys[-1] == keys[asked]
        assert ex["match"][e] == values[asked] and ex["prev"][e] == values[T - 2]
    for r in data["results"]:
        weights = np.array(r["weights"])  # (n, H, T)
        assert weights.shape == (n, r["n_heads"], T)
        np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-3)  # rounded to 4 decimals
        assert len(r["on_match"]) == len(r["on_prev"]) == r["n_heads"]
    one, two = _result(data, 1), _result(data, 2)
    assert one["accuracy"]["match"] < 0.3 < 0.95 < two["accuracy"]["match"]


def _chapter_namespace() -> dict:
    """The chapter's imports and its two-reads cell (task, model, training), executed here."""
    cells = json.loads(CHAPTER.read_text(encoding="utf-8"))["cells"]
    code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    imports = code[1]  # after the setup cell
    two_reads = next(c for c in code if "class TwoReads" in c)
    namespace: dict = {}
    exec(imports, namespace)  # the chapter's own cells
    exec(two_reads, namespace)
    return namespace


@pytest.mark.train
@pytest.mark.parametrize("n_heads", HEADS)
def test_bundled_results_are_what_the_chapters_code_trains(data, n_heads):
    """Trained here with the chapter's own cell (1 and 4 heads are also trained live in the
    chapter), the layer's weights at the query of the stored examples, its predictions and
    its accuracies on the chapter's 2,000 test sequences are the bundled ones."""
    torch.set_num_threads(1)
    ns = _chapter_namespace()
    keys, values, y_match, y_prev, asked = ns["two_reads_batch"](
        data["settings"]["n_test"], torch.Generator().manual_seed(data["settings"]["test_seed"]))
    shown = torch.tensor(data["examples"]["index"])
    assert keys[shown].tolist() == data["examples"]["keys"]
    model = ns["train_two_reads"](n_heads)
    with torch.no_grad(), ns["record_weights"](model):
        logits_match, logits_prev = model(keys, values)  # (n, 16) each
    weights = model.attn.last_weights[:, :, -1]  # (n, H, T) at the query
    result = _result(data, n_heads)
    # stored to 4 decimals; the same fp32 computation on one thread otherwise
    np.testing.assert_allclose(weights[shown].numpy(), result["weights"], atol=1e-4, rtol=0)
    assert logits_match[shown].argmax(-1).tolist() == result["predicted"]["match"]
    match = (logits_match.argmax(-1) == y_match).float().mean().item()
    prev = (logits_prev.argmax(-1) == y_prev).float().mean().item()
    assert abs(match - result["accuracy"]["match"]) <= 1e-3
    assert abs(prev - result["accuracy"]["prev"]) <= 1e-3


def test_the_chapter_states_the_bundled_accuracies(data):
    """The sentence before the explorer gives the accuracies of the bundled results."""
    cells = json.loads(CHAPTER.read_text(encoding="utf-8"))["cells"]
    index = next(i for i, c in enumerate(cells) if "heads_explorer()" in "".join(c["source"]))
    text = " ".join("".join(cells[index - 1]["source"]).split())
    for n_heads in (1, 2, 8):
        assert f"{_result(data, n_heads)['accuracy']['match']:.1%}" in text


# The explorer's frames and links ------------------------------------------------------------


def test_one_frame_per_head_count_and_example(explorer):
    c = explorer.controls
    assert [value for _, value in c["heads"].options] == list(HEADS)
    assert (c["example"].min, c["example"].max) == (0, N_EXAMPLES - 1)
    frames = [bytes(f.value) for f in images(explorer.pictures["heads"])]
    assert len(frames) == len(HEADS) * N_EXAMPLES
    assert all(f.startswith(PNG_MAGIC) for f in frames) and len(set(frames)) == len(frames)


def test_every_stack_is_jslinked_to_its_control(explorer):
    c = explorer.controls
    controls = [(c["heads"], "index"), (c["example"], "value")]
    assert len(explorer.links) == 3 * (1 + len(HEADS))  # wide and narrow pictures, texts
    for name in ("heads", "text"):
        by_depth = stacks_by_depth(explorer.pictures[name])
        assert len(by_depth) == 2 and len(by_depth[1]) == len(HEADS)
        for depth, stacks in by_depth.items():
            for s in stacks:
                found = [link for link in explorer.links
                         if link.target == (s, "selected_index")]
                assert len(found) == 1 and found[0].source == controls[depth]


@pytest.mark.parametrize("i", [1, 3])
def test_frames_are_the_renderers_for_that_head_count(explorer, data, i):
    """The frames under head count i are what the renderer draws for that count's results."""
    expected = _heads_frames(_result(data, HEADS[i]), data["examples"], N_EXAMPLES,
                               data["settings"]["C"])
    shown = [bytes(leaf.value) for leaf in explorer.pictures["heads"].children[i].children]
    assert shown == expected


_LUT = colormaps[WEIGHT_CMAP](np.linspace(0, 1, 256))[:, :3] * 255  # (256, 3) RGB


def _weights_read_back(png: bytes, box, H: int, T: int) -> np.ndarray:
    """The weight of each heatmap cell (H, T), read at its centre through the colour map.
    ``box`` is the heatmap's (x0, y0, x1, y1) in the frame's pixels, top-left origin."""
    rgb = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(float)  # (h, w, 3)
    x0, y0, x1, y1 = box
    xs = (x0 + (np.arange(T) + 0.5) * (x1 - x0) / T).astype(int)  # (T,) column centres
    ys = (y0 + (np.arange(H) + 0.5) * (y1 - y0) / H).astype(int)  # (H,) row centres
    centres = rgb[np.ix_(ys, xs)]  # (H, T, 3)
    dist = np.linalg.norm(centres[..., None, :] - _LUT, axis=-1)  # (H, T, 256)
    assert dist.min(-1).max() < 12, "a cell centre is not on the colour map"
    return dist.argmin(-1) / 255


@pytest.mark.parametrize("i, e", [(0, 0), (1, 1), (2, 2), (3, 5)])
def test_frame_shows_that_head_counts_weights(explorer, data, i, e):
    """Read back pixel by pixel, the heatmap of the frame for head count i and example e
    gives each head's bundled weights at the query, not those of another example."""
    result = _result(data, HEADS[i])
    H, T = result["n_heads"], len(data["examples"]["keys"][0])
    fig, ax, _ = heads_module._heads_figure(result, data["examples"], data["settings"]["C"])
    canvas = FigureCanvasAgg(fig)
    canvas.draw()  # the layout the frames are rendered with, frozen as they freeze it
    fig.set_layout_engine("none")
    canvas.draw()
    bbox = ax.get_window_extent()
    height = canvas.get_width_height()[1]
    box = (bbox.x0, height - bbox.y1, bbox.x1, height - bbox.y0)
    png = bytes(explorer.pictures["heads"].children[i].children[e].value)
    shown = _weights_read_back(png, box, H, T)
    expected = np.array(result["weights"][e])  # (H, T)
    np.testing.assert_allclose(shown, expected, atol=0.04, rtol=0)  # a 128-colour palette
    asked = data["examples"]["asked"]
    if H > 1:  # one head looks at the position before the query in every example
        other = next(f for f in range(N_EXAMPLES) if asked[f] != asked[e])
        other_weights = np.array(result["weights"][other])
        assert np.abs(shown - other_weights).max() > 0.3, "another example would look different"


def test_alt_text_names_where_each_head_looks(explorer, data):
    """Each frame has a text alternative (the text frame under it) that says where each head
    puts its largest weight, from the bundled weights."""
    for i, n_heads in enumerate(HEADS):
        result = _result(data, n_heads)
        for e, leaf in enumerate(explorer.pictures["text"].children[i].children):
            alt = explorer.alt[i][e]
            assert leaf.value == alt and alt.startswith(f"{n_heads} head")
            asked = data["examples"]["asked"][e]
            for h, row in enumerate(result["weights"][e]):
                peak = int(np.argmax(row))
                place = {asked: "the asked pair", 6: "the position before the query"}.get(
                    peak, f"position {peak}")
                assert f"head {h} puts {max(row):.2f} on {place}" in alt


def test_controls_wrap_and_move_by_keyboard(explorer):
    controls = list(explorer.controls.values())
    row = next(w for w in every_widget(explorer) if isinstance(w, widgets.Box)
               and controls[0] in w.children)
    assert list(row.children) == controls and row.layout.flex_flow == "row wrap"
    for control in controls:
        assert isinstance(control, (widgets.IntSlider, widgets.SelectionSlider))
        assert control.layout.flex == f"1 1 {W.CONTROL_WIDTH}"
        assert control.description and control.style.description_width == "80px"
    assert isinstance(explorer, W.HeadsExplorer) and isinstance(explorer, W.Explorer)
    assert set(explorer.pictures) == {"heads", "text"}


def test_page_weight_under_one_and_a_half_megabytes(explorer):
    """What the explorer adds to its page: its frames, base64 in the widget state."""
    state = embed_data(views=[explorer], state=dependency_state(explorer))["manager_state"]["state"]
    frames = [buffer["data"] for model in state.values()
              for buffer in model.get("buffers", []) if buffer["path"] == ["value"]]
    assert len(frames) == 2 * len(HEADS) * N_EXAMPLES  # wide and narrow
    weight = sum(len(f) for f in frames)
    assert weight < 1.5e6, f"the explorer adds {weight / 1e6:.2f} MB"
    leaf = explorer.pictures["heads"].children[0].children[0]
    assert base64.b64decode(state[leaf.model_id]["buffers"][0]["data"]) == leaf.value


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match=r"among the trained ones \[1, 2, 4, 8\], got \[3\]"):
        W.heads_explorer(heads=[3])
    with pytest.raises(ValueError, match=r"got \[\]"):
        W.heads_explorer(heads=[])
    with pytest.raises(ValueError, match=r"distinct.*got \[2, 2\]"):
        W.heads_explorer(heads=[2, 2])
    with pytest.raises(ValueError, match=r"between 1 and 8 .*got 0"):
        W.heads_explorer(n_examples=0)
    with pytest.raises(ValueError, match=r"between 1 and 8 .*got 9"):
        W.heads_explorer(n_examples=9)


def test_a_subset_of_head_counts(data):
    box = W.heads_explorer(heads=[4, 1], n_examples=2)
    assert [v for _, v in box.controls["heads"].options] == [4, 1]
    shown = [bytes(leaf.value) for leaf in box.pictures["heads"].children[1].children]
    assert shown == _heads_frames(_result(data, 1), data["examples"], 2, 32)


# Without Stack (ipywidgets 7, Colab): one picture, updated through the kernel ----------------


def test_kernel_path_moves_the_picture_with_each_control(monkeypatch, explorer):
    """Moving each control in the kernel shows the frame the static book's Stacks show for
    the same control values, and the text alternative follows."""
    monkeypatch.setattr(W.frames, "HAS_STACK", False)
    box = W.heads_explorer()
    models = every_widget(box)
    assert not any(isinstance(w, widgets.Stack) for w in models) and box.links == []
    assert not any(isinstance(w, Link) for w in models)
    picture, c = box.pictures["heads"], box.controls
    assert isinstance(picture, widgets.Image)
    for name, value in [("heads", 2), ("example", 3), ("heads", 3), ("example", 0)]:
        before = bytes(picture.value)
        if name == "heads":
            c[name].index = value
        else:
            c[name].value = value
        assert bytes(picture.value) != before, f"moving {name} changed nothing"
        i, e = c["heads"].index, c["example"].value
        static = explorer.pictures["heads"].children[i].children[e]
        assert bytes(picture.value) == bytes(static.value)
        assert box.pictures["text"].value == box.alt[i][e]
