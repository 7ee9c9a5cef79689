import base64
import io

import ipywidgets as widgets
import numpy as np
import pytest
import torch
from ipywidgets.embed import embed_data
from matplotlib import colormaps
from PIL import Image

from transformer_lib import widgets as W
from transformer_lib.encoder_decoder import EncoderDecoder, EncoderDecoderConfig
from transformer_lib.plotting import WEIGHT_CMAP
from transformer_lib.positional import PAIRINGS
from transformer_lib.tasks import BOS, reversal_batch

N_EXAMPLES, SEQ_LEN, SEED = 2, 4, 3
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _images(widget) -> list[widgets.Image]:
    if isinstance(widget, widgets.Image):
        return [widget]
    return [leaf for child in getattr(widget, "children", ()) for leaf in _images(child)]


def _stacks_by_depth(stack, depth=0, out=None) -> dict[int, list[widgets.Stack]]:
    out = {} if out is None else out
    out.setdefault(depth, []).append(stack)
    for child in stack.children:
        if isinstance(child, widgets.Stack):
            _stacks_by_depth(child, depth + 1, out)
    return out


def _assert_linked(stack, links, controls):
    """Every Stack at depth d has exactly one jslink from controls[d] to its selected_index."""
    by_depth = _stacks_by_depth(stack)
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
    config = EncoderDecoderConfig(11, 11, d_model=32, n_heads=2, n_layers=2, d_ff=32, max_len=64)
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
        model(src, out[:, :SEQ_LEN])
    weights = [layer.cross_attn.last_weights.clone() for layer in model.decoder.layers]  # L × (n, H, T, S)
    return src, out, weights


@pytest.fixture(scope="module")
def rope():
    return W.rope_explorer(head_dim=4, n_positions=4, seed=1)


# attention_explorer ------------------------------------------------------------------------


def test_attention_explorer_has_one_frame_per_combination(explorer):
    frames = _images(explorer.stack)
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
    _assert_linked(explorer.stack, explorer.links, controls)
    assert len(explorer.links) == 1 + N_EXAMPLES * (1 + 2 * (1 + 2))


# Reading a frame back: the colour of each heatmap cell, decoded through the colour map ----

_LUT = colormaps[WEIGHT_CMAP](np.linspace(0, 1, 256))[:, :3] * 255  # (256, 3) RGB


def _pixels(png: bytes) -> tuple[np.ndarray, np.ndarray]:
    """Each pixel's weight read through the colour map (nearest of 256 entries), and whether
    its colour is on the colour map at all (dimmed rows, labels and background are not)."""
    rgb = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(float)  # (h, w, 3)
    dist = np.linalg.norm(rgb[:, :, None, :] - _LUT[None, None], axis=-1)  # (h, w, 256)
    return dist.argmin(-1) / 255, dist.min(-1) < 12  # palette PNG: a few units of rounding


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
              explorer.stack.children[e].children[l].children[h].children]
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
    tokens = torch.tensor([[3, 10, 7]])
    with torch.no_grad():
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
    with pytest.raises(ValueError, match=r"seq_len \(64\).*max_len \(64\)"):
        W.attention_explorer(model, seq_len=64)
    with pytest.raises(ValueError, match=r"got Linear"):
        W.attention_explorer(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match=r"= 2080 frames"):  # 40 × 2 × 2 × 13
        W.attention_explorer(model, n_examples=40, seq_len=12)


def test_attention_explorer_state_embeds_for_the_static_book(explorer):
    data = embed_data(views=[explorer])
    state = data["manager_state"]["state"]
    assert data["view_specs"][0]["model_id"] == explorer.model_id
    image = explorer.stack.children[1].children[0].children[1].children[2]
    buffers = state[image.model_id]["buffers"]
    assert buffers[0]["path"] == ["value"]
    assert base64.b64decode(buffers[0]["data"]) == image.value
    link = state[explorer.links[-1].model_id]["state"]  # the outermost Stack's link comes last
    assert link["target"] == [f"IPY_MODEL_{explorer.stack.model_id}", "selected_index"]


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
    table = W._rope_score_table(q, k, 10000.0, P, "half")  # (P, P)
    # fp32 rotation of 16-channel vectors with |q·k| up to ~15: 1e-5 absolute
    np.testing.assert_allclose(table.numpy(), _score_reference(q, k, 10000.0, P), atol=1e-5, rtol=0)
    for pairing in PAIRINGS:
        table = W._rope_score_table(q, k, 10000.0, P, pairing)
        for delta in range(-(P - 1), P):
            diagonal = torch.diagonal(table, offset=delta)  # table[m, m + delta] for every valid m
            torch.testing.assert_close(diagonal, diagonal[:1].expand_as(diagonal), atol=1e-5, rtol=0)
    assert not torch.allclose(W._rope_score_table(q, k, 10000.0, P, "half"), table, atol=1e-3)


def _links_of(stack, links):
    stacks = [s for group in _stacks_by_depth(stack).values() for s in group]
    return [link for link in links if any(link.target == (s, "selected_index") for s in stacks)]


def test_rope_explorer_frames_links_and_lookup(rope):
    c = rope.controls
    assert (c["m"].max, c["i"].max) == (3, 1)
    assert [label for label, _ in c["pairing"].options] == list(PAIRINGS)
    pair, score = rope.stacks["pair"], rope.stacks["score"]
    assert len(_images(pair)) == 2 * 4 * 2 and len(_images(score)) == 2 * 4
    pair_links, score_links = _links_of(pair, rope.links), _links_of(score, rope.links)
    assert len(pair_links) + len(score_links) == len(rope.links)
    _assert_linked(pair, pair_links, [(c["pairing"], "index"), (c["m"], "value"), (c["i"], "value")])
    _assert_linked(score, score_links, [(c["pairing"], "index"), (c["m"], "value")])
    frames = [bytes(f.value) for f in _images(pair) + _images(score)]
    assert len(set(frames)) == len(frames)
    for p, pairing in enumerate(PAIRINGS):
        expected = W._rope_pair_frames(rope.q, rope.k, 1, 10000.0, 4, pairing)
        shown = [bytes(pair.children[p].children[m].children[1].value) for m in range(4)]  # pair i = 1
        assert shown == expected
        expected = W._rope_score_frames(rope.q, rope.k, 10000.0, 4, pairing)
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
