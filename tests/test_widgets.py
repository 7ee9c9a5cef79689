import base64
import io
import math

import ipywidgets as widgets
import numpy as np
import pytest
import torch
from ipywidgets.embed import dependency_state, embed_data
from ipywidgets.widgets.widget_link import Link
from matplotlib import colormaps
from matplotlib.colors import to_rgb
from PIL import Image
from widget_support import every_model, every_widget, images, stacks_by_depth

from transformer_lib import widgets as W
from transformer_lib.encoder_decoder import EncoderDecoder, EncoderDecoderConfig
from transformer_lib.plotting import WEIGHT_CMAP
from transformer_lib.positional import PAIRINGS
from transformer_lib.recording import record_weights
from transformer_lib.tasks import BOS, decode_with_cross_attention, reversal_batch
from transformer_lib.widgets.attention import _attention_frames
from transformer_lib.widgets.frames import _png_width
from transformer_lib.widgets.rope import _rope_pair_frames, _rope_score_frames, _rope_score_table

# Draws figures or explorer frames, seconds of CPU each: `make test` runs them, `make check` not.
pytestmark = pytest.mark.figures

N_EXAMPLES, SEQ_LEN, SEED = 2, 4, 3
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _assert_linked(stack, links, controls):
    """Every Stack at depth d has exactly one jslink from controls[d] to its selected_index."""
    by_depth = stacks_by_depth(stack)
    assert len(by_depth) == len(controls)
    assert len(links) == sum(len(stacks) for stacks in by_depth.values())
    for depth, stacks in by_depth.items():
        for s in stacks:
            found = [link for link in links if link.target == (s, "selected_index")]
            assert len(found) == 1
            assert found[0].source == controls[depth]


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)  # untrained: the widget must not care
    config = EncoderDecoderConfig(11, 11, d_model=32, n_heads=2, n_layers=2, d_ff=32,
                                  max_seq_len=64)
    return EncoderDecoder(config).eval()


@pytest.fixture(scope="module")
def explorer(model):
    return W.attention_explorer(model, n_examples=N_EXAMPLES, seq_len=SEQ_LEN, seed=SEED)


@pytest.fixture(scope="module")
def reference(model):
    """Sources, greedy outputs and cross-attention computed here, independently of the widget."""
    src, _, _ = reversal_batch(N_EXAMPLES, SEQ_LEN, 11, torch.Generator().manual_seed(SEED))
    with torch.no_grad():
        out = model.greedy_decode(src, SEQ_LEN, BOS)  # (n, 1 + T)
        with record_weights(model):
            model(src, out[:, :SEQ_LEN])
    weights = [layer.cross_attn.last_weights.clone() for layer in model.decoder.layers]  # L × (n, H, T, S)
    return src, out, weights


@pytest.fixture(scope="module")
def rope():
    return W.rope_explorer(head_dim=4, n_positions=4, seed=1)


# attention_explorer ------------------------------------------------------------------------


def test_attention_explorer_has_one_frame_per_combination(explorer):
    frames = images(explorer.pictures["attention"])
    assert len(frames) == N_EXAMPLES * 2 * 2 * (SEQ_LEN + 1)
    values = [bytes(f.value) for f in frames]  # Image.value is a memoryview
    assert all(v.startswith(PNG_MAGIC) for v in values)
    assert len(set(values)) == len(values)  # no two frames alike


def test_attention_explorer_control_ranges_match_model(explorer, model):
    c = explorer.controls
    assert (c["example"].min, c["example"].max) == (0, N_EXAMPLES - 1)
    assert (c["layer"].min, c["layer"].max) == (0, len(model.decoder.layers) - 1)
    assert (c["head"].min, c["head"].max) == (0, model.n_heads - 1)
    assert list(c["step"].options) == ["all"] + [str(t) for t in range(SEQ_LEN)]


def test_attention_explorer_every_stack_is_jslinked_to_its_control(explorer):
    c = explorer.controls
    controls = [(c["example"], "value"), (c["layer"], "value"), (c["head"], "value"), (c["step"], "index")]
    _assert_linked(explorer.pictures["attention"], explorer.links, controls)
    assert len(explorer.links) == 1 + N_EXAMPLES * (1 + 2 * (1 + 2))


# Reading a frame back: the colour of each heatmap cell, decoded through the colour map ----

_LUT = colormaps[WEIGHT_CMAP](np.linspace(0, 1, 256))[:, :3] * 255  # (256, 3) RGB


def _pixels(png: bytes) -> tuple[np.ndarray, np.ndarray]:
    """Each pixel's weight read through the colour map (nearest of 256 entries), and whether
    its colour is on the colour map at all (dimmed rows, labels and background are not)."""
    rgb = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))  # (h, w, 3)
    # A palette PNG has at most COLOURS colours: decode each colour once, then every pixel.
    colours, index = np.unique(rgb.reshape(-1, 3), axis=0, return_inverse=True)  # (K, 3), (h*w,)
    dist = np.linalg.norm(colours[:, None, :].astype(float) - _LUT[None], axis=-1)  # (K, 256)
    values = (dist.argmin(-1) / 255)[index.reshape(-1)].reshape(rgb.shape[:2])  # (h, w)
    on_map = (dist.min(-1) < 12)[index.reshape(-1)].reshape(rgb.shape[:2])  # a few units of rounding
    return values, on_map


def _heatmap_box(png: bytes) -> tuple[int, int, int, int]:
    """Pixel bounds (x0, x1, y0, y1) of the heatmap in a frame where every row is shown: the
    first block of colour-map columns from the left (the last one is the colour bar)."""
    _, on_map = _pixels(png)
    cols = np.flatnonzero(on_map.sum(0) > 3)
    gaps = np.flatnonzero(np.diff(cols) > 1)
    x0, x1 = cols[0], cols[gaps[0]] if len(gaps) else cols[-1]
    rows = np.flatnonzero(on_map[:, x0:x1 + 1].sum(1) > 3)
    return x0, x1, rows[0], rows[-1]


def _cells(png: bytes, box: tuple[int, int, int, int], T: int, S: int):
    """The weight read at the centre of each of the T × S cells, and whether it is shown."""
    values, on_map = _pixels(png)
    x0, x1, y0, y1 = box
    ys = (y0 + (np.arange(T) + 0.5) * (y1 - y0 + 1) / T).astype(int)  # (T,) row centres
    xs = (x0 + (np.arange(S) + 0.5) * (x1 - x0 + 1) / S).astype(int)  # (S,) column centres
    return values[np.ix_(ys, xs)], on_map[np.ix_(ys, xs)]  # (T, S) each


# The palette PNG keeps 128 colours: a weight read back is within about 0.03.
PIXEL_ATOL = 0.04


@pytest.mark.parametrize("e, l, h", [(0, 0, 0), (1, 1, 0), (0, 1, 1)])
def test_attention_explorer_frame_at_indices_shows_that_combination(explorer, reference, e, l, h):
    """The frames under example e, layer l, head h picture that map: read back pixel by pixel
    through the colour map, they give the weights computed here; step frame 1 + t shows rows
    0 … t and dims the rows the decoder has not produced yet."""
    src, out, weights = reference
    expected = weights[l][e, h].numpy()  # (T, S)
    frames = [bytes(leaf.value) for leaf in
              explorer.pictures["attention"].children[e].children[l].children[h].children]
    assert len(frames) == SEQ_LEN + 1
    box = _heatmap_box(frames[0])
    shown_all, visible = _cells(frames[0], box, SEQ_LEN, SEQ_LEN)
    assert visible.all()
    np.testing.assert_allclose(shown_all, expected, atol=PIXEL_ATOL, rtol=0)
    other_head = weights[l][e, 1 - h].numpy()
    assert np.abs(shown_all - other_head).max() > 0.1, "another head's map would look different"
    for t in range(SEQ_LEN):
        values, visible = _cells(frames[1 + t], box, SEQ_LEN, SEQ_LEN)
        assert visible[:t + 1].all() and not visible[t + 1:].any()
        np.testing.assert_allclose(values[:t + 1], expected[:t + 1], atol=PIXEL_ATOL, rtol=0)


def test_attention_explorer_live_callback_renders_typed_sequence(explorer, model):
    live = explorer.live
    explorer.controls["layer"].value, explorer.controls["head"].value = 1, 0
    assert live["image"].layout.display == "none"  # nothing to show before a render
    live["text"].value = "3 10 7"
    live["button"].click()
    assert live["image"].layout.display is None
    assert live["image"].layout.max_width == f"{_png_width(bytes(live['image'].value))}px"
    tokens = torch.tensor([[3, 10, 7]])
    with torch.no_grad(), record_weights(model):
        out = model.greedy_decode(tokens, 3, BOS)  # (1, 4)
        model(tokens, out[:, :3])
    weights = model.decoder.layers[1].cross_attn.last_weights[0, 0].numpy()  # (T, S)
    picture = bytes(live["image"].value)
    values, visible = _cells(picture, _heatmap_box(picture), 3, 3)
    assert visible.all()
    np.testing.assert_allclose(values, weights, atol=PIXEL_ATOL, rtol=0)
    assert "decoded: " + " ".join(map(str, out[0, 1:].tolist())) in live["status"].value

    live["text"].value = "3x"  # a bad sequence: a message, and the picture stays
    explorer.render_live()
    assert "1..10" in live["status"].value and bytes(live["image"].value) == picture
    explorer.controls["layer"].value = 0


def test_attention_explorer_rejects_bad_arguments(model):
    with pytest.raises(ValueError, match=r"n_examples \(0\)"):
        W.attention_explorer(model, n_examples=0)
    with pytest.raises(ValueError, match=r"seq_len \(64\).*max_seq_len \(64\)"):
        W.attention_explorer(model, seq_len=64)
    with pytest.raises(ValueError, match=r"got Linear"):
        W.attention_explorer(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match=r"= 2080 frames"):  # 40 × 2 × 2 × 13
        W.attention_explorer(model, n_examples=40, seq_len=12)


def test_attention_explorer_state_embeds_for_the_static_book(explorer):
    data = embed_data(views=[explorer])
    state = data["manager_state"]["state"]
    assert data["view_specs"][0]["model_id"] == explorer.model_id
    stack = explorer.pictures["attention"]
    image = stack.children[1].children[0].children[1].children[2]
    buffers = state[image.model_id]["buffers"]
    assert buffers[0]["path"] == ["value"]
    assert base64.b64decode(buffers[0]["data"]) == image.value
    link = state[explorer.links[-1].model_id]["state"]  # the outermost Stack's link comes last
    assert link["target"] == [f"IPY_MODEL_{stack.model_id}", "selected_index"]


# rope_explorer -----------------------------------------------------------------------------


def _score_reference(q, k, theta, P):
    """q_mᵀ k_n for the "half" pairing via complex numbers: sum_i Re(z_q conj(z_k) e^{i(m-n)θ_i})."""
    q, k = q.double().numpy(), k.double().numpy()
    D = q.shape[0]
    zq, zk = q[: D // 2] + 1j * q[D // 2 :], k[: D // 2] + 1j * k[D // 2 :]  # (D/2,)
    theta_i = theta ** (-np.arange(0, D, 2) / D)  # (D/2,)
    offsets = np.arange(P)[:, None] - np.arange(P)[None, :]  # (P, P): m - n
    return np.real((zq * zk.conj() * np.exp(1j * offsets[..., None] * theta_i)).sum(-1))  # (P, P)


def test_rope_score_table_depends_on_offset_only():
    q, k = torch.randn(2, 16, generator=torch.Generator().manual_seed(0))
    P = 16
    table = _rope_score_table(q, k, 10000.0, P, "half")  # (P, P)
    # fp32 rotation of 16-channel vectors with |q·k| up to ~15: 1e-5 absolute
    np.testing.assert_allclose(table.numpy(), _score_reference(q, k, 10000.0, P), atol=1e-5, rtol=0)
    for pairing in PAIRINGS:
        table = _rope_score_table(q, k, 10000.0, P, pairing)
        for delta in range(-(P - 1), P):
            diagonal = torch.diagonal(table, offset=delta)  # table[m, m + delta] for every valid m
            torch.testing.assert_close(diagonal, diagonal[:1].expand_as(diagonal), atol=1e-5, rtol=0)
    assert not torch.allclose(_rope_score_table(q, k, 10000.0, P, "half"), table, atol=1e-3)


def _links_of(stack, links):
    stacks = [s for group in stacks_by_depth(stack).values() for s in group]
    return [link for link in links if any(link.target == (s, "selected_index") for s in stacks)]


def test_rope_explorer_frames_links_and_lookup(rope):
    c = rope.controls
    assert [m for _, m in c["m"].options] == [W.KEY_OFFSET + j for j in range(4)]
    assert c["i"].max == 1
    assert [label for label, _ in c["pairing"].options] == list(PAIRINGS)
    pair, score = rope.pictures["pair"], rope.pictures["score"]
    assert len(images(pair)) == 2 * 4 * 2 and len(images(score)) == 2 * 4
    pair_links, score_links = _links_of(pair, rope.links), _links_of(score, rope.links)
    assert len(pair_links) + len(score_links) == len(rope.links)
    _assert_linked(pair, pair_links, [(c["pairing"], "index"), (c["m"], "index"), (c["i"], "value")])
    _assert_linked(score, score_links, [(c["pairing"], "index"), (c["m"], "index")])
    frames = [bytes(f.value) for f in images(pair) + images(score)]
    assert len(set(frames)) == len(frames)
    for p, pairing in enumerate(PAIRINGS):
        expected = _rope_pair_frames(rope.q, rope.k, 1, 10000.0, 4, pairing)
        shown = [bytes(pair.children[p].children[m].children[1].value) for m in range(4)]  # pair i = 1
        assert shown == expected
        expected = _rope_score_frames(rope.q, rope.k, 10000.0, 4, pairing)
        assert [bytes(leaf.value) for leaf in score.children[p].children] == expected


def test_rope_explorer_rejects_bad_arguments():
    with pytest.raises(ValueError, match=r"got 5"):
        W.rope_explorer(head_dim=5)
    with pytest.raises(ValueError, match=r"n_positions must be >= 2, got 1"):
        W.rope_explorer(n_positions=1)
    with pytest.raises(ValueError, match=r"theta must be > 1, got 1.0"):
        W.rope_explorer(theta=1.0)
    with pytest.raises(ValueError, match=r"= 1024 frames"):  # 2 × 16 × 32
        W.rope_explorer(head_dim=64)


# Layout: pictures that fill the column, controls that wrap and move by keyboard, page weight


def _png_size(png: bytes) -> tuple[int, int]:
    return Image.open(io.BytesIO(png)).size


@pytest.mark.parametrize("name", ["attention", "rope"])
def test_explorer_pictures_scale_with_the_container(explorer, rope, name):
    """Every frame is shown as wide as the container, never wider than its own pixels (so
    never blurred by upscaling), with its aspect ratio; the frames share one Layout model."""
    box = explorer if name == "attention" else rope
    frames = [leaf for leaf in images(box) if len(leaf.value)]  # not the empty live picture
    layouts = {id(leaf.layout) for leaf in frames}
    assert len(frames) > 1 and len(layouts) <= 2  # rope: one per picture
    for leaf in frames:
        width, height = _png_size(bytes(leaf.value))
        assert leaf.layout.width == "100%" and leaf.layout.height == "auto"
        assert leaf.layout.max_width == f"{width}px"
        assert 300 <= width <= W.FRAME_WIDTH * W.DPI and height >= 300
    # One Layout model per frame would add ~120 bytes a frame to the page's widget state.
    stacks = [w for w in every_widget(box) if isinstance(w, widgets.Stack)]
    assert len({id(s.layout) for s in stacks}) <= 4  # rope: one per picture, and its outer Stack
    embedded = embed_data(views=[box], state=dependency_state(box))["manager_state"]["state"]
    n_layouts = sum(state["model_name"] == "LayoutModel" for state in embedded.values())
    assert n_layouts < 20 < len(frames) + len(stacks)


def test_attention_frames_fill_the_content_column_at_the_default_length(model):
    """The default 8 decoding steps give a frame about as wide as the book's column (~750 px),
    with text at FONT points, one pixel per CSS pixel."""
    src, _, _ = reversal_batch(1, 8, 11, torch.Generator().manual_seed(0))
    out, weights = decode_with_cross_attention(model, src)  # (1, 9), (L, 1, H, 8, 8)
    frame = _attention_frames(weights[0, 0, 0], src[0].tolist(), out[0].tolist(), 0, 0, steps=False)[0]
    width, height = _png_size(frame)
    assert 700 <= width <= W.FRAME_WIDTH * W.DPI and 450 <= height <= 650
    assert W.DPI == 100 and W.FONT >= 11


@pytest.mark.parametrize("name", ["attention", "rope"])
def test_explorer_controls_wrap_and_move_by_keyboard(explorer, rope, name):
    """The controls sit in one row that wraps (one control per row on a phone), each growing
    from the same basis; each is a slider or a dropdown, which the arrow keys move (toggle
    buttons only take Space or Enter, one button at a time)."""
    box = explorer if name == "attention" else rope
    controls = list(box.controls.values())
    row = next(w for w in every_widget(box) if isinstance(w, widgets.Box)
               and controls[0] in w.children)
    assert list(row.children) == controls
    assert row.layout.flex_flow == "row wrap" and row.layout.width == "100%"
    for control in controls:
        assert isinstance(control, (widgets.IntSlider, widgets.SelectionSlider, widgets.Dropdown))
        assert control.layout.flex == f"1 1 {W.CONTROL_WIDTH}" and control.layout.min_width == "0"
        assert control.layout.max_width == W.CONTROL_MAX_WIDTH
        assert control.description and control.style.description_width == "80px"
    assert not any(isinstance(w, widgets.ToggleButtons) for w in every_widget(box))


def test_rope_explorer_pictures_wrap_below_each_other(rope):
    pictures = next(w for w in every_widget(rope) if isinstance(w, widgets.Box)
                    and rope.pictures["pair"] in w.children)
    assert list(pictures.children) == [rope.pictures["pair"], rope.pictures["score"]]
    assert pictures.layout.flex_flow == "row wrap"
    widths = [_png_size(bytes(images(s)[0].value))[0] for s in pictures.children]
    assert sum(widths) <= W.FRAME_WIDTH * W.DPI  # side by side in the column


def test_explorers_page_weight(model, rope):
    """What the pictures add to a page, as base64 in its widget state. The chapter's explorer
    (3 examples × 2 layers × 2 heads × 9 steps) is estimated from one map's 9 frames: ~1.0 MB
    of PNG when measured with a trained model; the appendix's RoPE explorer (12 positions) from
    this one's frames per picture."""
    src, _, _ = reversal_batch(1, 8, 11, torch.Generator().manual_seed(0))
    out, weights = decode_with_cross_attention(model, src)
    frames = _attention_frames(weights[1, 0, 0], src[0].tolist(), out[0].tolist(), 1, 0)
    chapter = 3 * 2 * 2 * sum(map(len, frames)) * 4 / 3
    assert chapter < 2.5e6, f"the chapter's explorer would add {chapter / 1e6:.1f} MB"
    pair = np.mean([len(leaf.value) for leaf in images(rope.pictures["pair"])])
    score = np.mean([len(leaf.value) for leaf in images(rope.pictures["score"])])
    appendix = (2 * 12 * 8 * pair + 2 * 12 * score) * 4 / 3
    assert appendix < 3.0e6, f"the appendix's RoPE explorer would add {appendix / 1e6:.1f} MB"


# Without Stack (ipywidgets 7, Colab): one picture, updated through the kernel ----------------


@pytest.fixture
def kernel_path(monkeypatch):
    """The explorers as a kernel whose ipywidgets has no Stack builds them."""
    monkeypatch.setattr(W.frames, "HAS_STACK", False)


def test_kernel_path_uses_no_stack_and_no_link(kernel_path, model):
    box = W.attention_explorer(model, n_examples=N_EXAMPLES, seq_len=SEQ_LEN, seed=SEED)
    models = every_model(box)
    assert not any(isinstance(w, widgets.Stack) for w in models)
    assert not any(isinstance(w, Link) for w in models) and box.links == []
    assert isinstance(box.pictures["attention"], widgets.Image)
    rope = W.rope_explorer(head_dim=4, n_positions=4, seed=1)
    assert isinstance(rope.pictures["pair"], widgets.Image) and rope.links == []
    assert not any(isinstance(w, widgets.Stack) for w in every_model(rope))


def test_kernel_path_moves_the_picture_to_the_chosen_frame(kernel_path, model, explorer):
    """Moving each control in the kernel shows the frame the static book's Stacks would show
    for the same control values."""
    box = W.attention_explorer(model, n_examples=N_EXAMPLES, seq_len=SEQ_LEN, seed=SEED)
    c, stacks = box.controls, explorer.pictures["attention"]
    for e, l, h, step in [(0, 0, 0, 0), (1, 0, 0, 0), (1, 1, 0, 0), (1, 1, 1, 0), (1, 1, 1, 3)]:
        c["example"].value, c["layer"].value, c["head"].value = e, l, h
        c["step"].index = step
        static = stacks.children[e].children[l].children[h].children[step]
        assert bytes(box.pictures["attention"].value) == bytes(static.value)


def test_kernel_path_rope_explorer_follows_each_control(kernel_path):
    rope = W.rope_explorer(head_dim=4, n_positions=4, seed=1)
    pictures = rope.pictures
    for name, value in [("m", 2), ("i", 1), ("pairing", 1)]:
        before = (bytes(pictures["pair"].value), bytes(pictures["score"].value))
        if name in ("pairing", "m"):  # the query's position m: option index 2
            rope.controls[name].index = value
        else:
            rope.controls[name].value = value
        after = (bytes(pictures["pair"].value), bytes(pictures["score"].value))
        assert after != before, f"moving {name} changed no picture"
    m, i, p = 2, 1, 1
    expected = _rope_pair_frames(rope.q, rope.k, i, 10000.0, 4, PAIRINGS[p])[m]
    assert bytes(pictures["pair"].value) == expected


# What an explorer is: a typed widget, built from a model it is given ------------------------


def test_attention_explorer_needs_a_model_and_says_how_to_get_one(model):
    """Nothing is trained behind the reader's back: without a model the call stops at once,
    and the message names the function that trains one."""
    with pytest.raises(TypeError, match=r"needs a trained reversal model.*train_reversal\(\)"):
        W.attention_explorer()
    with pytest.raises(TypeError, match=r"train_reversal"):
        W.attention_explorer(None, n_examples=1)
    with pytest.raises(ValueError, match=r"got str: train one first.*train_reversal"):
        W.attention_explorer("model")


@pytest.mark.parametrize("name", ["attention", "rope"])
def test_explorers_are_typed_widgets_with_named_parts(explorer, rope, name):
    """Both explorers are an Explorer (a VBox, displayed as itself) whose controls, pictures
    and links are declared attributes, and whose pictures sit in its own tree of children."""
    box = explorer if name == "attention" else rope
    expected = {"attention": (W.AttentionExplorer, {"attention"}),
                "rope": (W.RopeExplorer, {"pair", "score"})}[name]
    assert isinstance(box, expected[0]) and isinstance(box, W.Explorer)
    assert isinstance(box, widgets.VBox) and box._model_name == "VBoxModel"
    assert set(box.pictures) == expected[1]
    shown = every_widget(box)
    assert all(any(p is w for w in shown) for p in box.pictures.values())
    assert all(any(c is w for w in shown) for c in box.controls.values())
    assert not hasattr(box, "stack") and not hasattr(box, "stacks")


def test_frames_take_the_sizes_of_the_house_style():
    from transformer_lib.plotting import style

    assert (W.FRAME_WIDTH, W.FONT, W.DPI) == (style.MAX_WIDTH, style.TITLE_SIZE, style.DPI)
    assert W.frames.FRAME_WIDTH is style.MAX_WIDTH


def _pixels_near(png: bytes, colour: str, within: float = 10.0) -> int:
    """How many pixels of ``png`` lie within ``within`` (RGB units, 0-255) of ``colour``."""
    rgb = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).reshape(-1, 3).astype(float)
    target = np.array(to_rgb(colour)) * 255
    return int((np.linalg.norm(rgb - target, axis=1) < within).sum())


def test_rope_frames_draw_q_and_k_in_the_palette(rope):
    """q in the palette's blue and k in its vermillion, in both pictures; none of matplotlib's
    "tab:" red (which the palette replaces)."""
    from transformer_lib.plotting.style import BLUE, VERMILLION

    pair = bytes(images(rope.pictures["pair"])[1].value)
    score = bytes(images(rope.pictures["score"])[1].value)
    for png in (pair, score):
        assert _pixels_near(png, BLUE) > 20 and _pixels_near(png, VERMILLION) > 5
        assert _pixels_near(png, "tab:red") == 0


# The RoPE helpers the explorer draws with (transformer_lib.positional) ----------------------


@pytest.mark.parametrize("pairing", PAIRINGS)
def test_pair_channels_and_rope_frequencies_are_what_apply_rope_turns(pairing):
    """A unit vector on the first channel of pair i, rotated by apply_rope to position m,
    lands on (cos mθ_i, sin mθ_i) in that pair's two channels and nowhere else, with
    θ_i = theta^(-2i/D) written out here."""
    from transformer_lib.positional import (
        apply_rope,
        pair_channels,
        rope_cos_sin,
        rope_frequencies,
    )

    D, theta, m = 8, 100.0, 3
    frequencies = rope_frequencies(D, theta)
    assert frequencies.shape == (D // 2,) and frequencies.dtype == torch.float64
    written_out = [theta ** (-2 * i / D) for i in range(D // 2)]
    np.testing.assert_allclose(frequencies.numpy(), written_out, rtol=1e-15)
    cos, sin = rope_cos_sin(m + 1, D, theta, dtype=torch.float64)  # (m + 1, D/2) each
    pairs = [pair_channels(i, D, pairing) for i in range(D // 2)]
    assert sorted(c for pair in pairs for c in pair) == list(range(D))  # every channel once
    for i, (a, b) in enumerate(pairs):
        x = torch.zeros(m + 1, D, dtype=torch.float64)
        x[:, a] = 1.0
        turned = apply_rope(x, cos, sin, pairing)[m]  # (D,)
        angle = m * float(frequencies[i])
        expected = torch.zeros(D, dtype=torch.float64)
        expected[a], expected[b] = math.cos(angle), math.sin(angle)
        torch.testing.assert_close(turned, expected, atol=1e-12, rtol=0)  # fp64


def test_rope_helpers_reject_bad_arguments():
    from transformer_lib.positional import pair_channels, rope_frequencies

    with pytest.raises(ValueError, match="got head_dim=5"):
        rope_frequencies(5)
    with pytest.raises(ValueError, match="theta must be > 1, got 1.0"):
        rope_frequencies(8, 1.0)
    with pytest.raises(ValueError, match=r"pair i \(4\) must be in \[0, head_dim/2 - 1\]"):
        pair_channels(4, 8)
    with pytest.raises(ValueError, match="pairing must be one of"):
        pair_channels(0, 8, "adjacent")


def test_the_package_exports_explorers_not_renderers():
    """The frame renderers stay in their modules, and the reversal task's decoding in tasks:
    the package hands out the explorers and their settings only."""
    private = [name for name in vars(W) if name.startswith("_") and not name.startswith("__")]
    assert private == []
    assert not hasattr(W, "decode_with_cross_attention")
    assert all(hasattr(W, name) for name in W.__all__)
