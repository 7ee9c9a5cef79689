"""The sampling explorer of chapter 6: its frames show what the sampling rules and the bundled
model give, computed here independently."""
import io

import ipywidgets as widgets
import numpy as np
import pytest
import torch
from ipywidgets.embed import dependency_state, embed_data
from matplotlib.colors import to_rgb
from PIL import Image
from widget_support import images

from transformer_lib import widgets as W
from transformer_lib.plotting.style import BLUE, GREY
from transformer_lib.text import generate_text, load_text_model
from transformer_lib.widgets.frames import _png_width
from transformer_lib.widgets.sampling import _sampling_bars, _sampling_frames

# Draws figures or explorer frames, seconds of CPU each: `make test` runs them, `make check` not.
pytestmark = pytest.mark.figures

TEMPERATURES, TOP_KS, TOP_PS = (0.0, 1.0), (None, 3), (None, 0.9)
RULES = [(t, k, p) for t in TEMPERATURES for k in TOP_KS for p in TOP_PS]
PROMPT, SEED, N_NEW = "MACBETH.\nI have s", 3, 24
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def bundled():
    model, tokenizer, _ = load_text_model()
    return model, tokenizer


@pytest.fixture(scope="module")
def explorer(bundled):
    return W.sampling_explorer(*bundled, prompt=PROMPT, temperatures=TEMPERATURES,
                               top_ks=TOP_KS, top_ps=TOP_PS, n_new=N_NEW, seed=SEED)


def _frame(explorer, t: int, k: int, p: int) -> bytes:
    return bytes(explorer.pictures["sampling"].children[t].children[k].children[p].value)


def _reference_probs(logits: torch.Tensor, temperature: float, top_k, top_p) -> np.ndarray:
    """The rule written out in NumPy (fp64): softmax(z / τ), keep the top_k largest, then the
    most likely tokens while the mass before them is below top_p, renormalise."""
    z = logits.double().numpy()
    if temperature == 0:
        out = np.zeros_like(z)
        out[z.argmax()] = 1.0
        return out
    probs = np.exp((z - z.max()) / temperature)
    probs /= probs.sum()
    order = np.argsort(-probs, kind="stable")
    keep = np.zeros(len(z), dtype=bool)
    keep[order[: top_k or len(z)]] = True
    if top_p is not None:
        kept_sorted = np.where(keep[order], probs[order], 0.0)
        kept_sorted /= kept_sorted.sum()
        before = np.cumsum(kept_sorted) - kept_sorted
        keep[order[before >= top_p]] = False
    out = np.where(keep, probs, 0.0)
    return out / out.sum()


def test_one_frame_per_combination_and_greedy_ignores_the_cuts(explorer):
    frames = [bytes(leaf.value) for leaf in images(explorer.pictures["sampling"])]
    assert len(frames) == len(TEMPERATURES) * len(TOP_KS) * len(TOP_PS)
    assert all(f.startswith(PNG_MAGIC) for f in frames)
    greedy, sampled = frames[:4], frames[4:]  # temperature 0 first
    assert len(set(greedy)) == 1  # top-k and top-p change nothing when greedy
    assert len(set(sampled)) == len(sampled)  # every other rule draws its own picture
    assert list(explorer.continuations) == RULES


def test_every_stack_is_jslinked_to_its_control(explorer):
    c = explorer.controls
    controls = [(c["temperature"], "index"), (c["top_k"], "index"), (c["top_p"], "index")]
    by_depth, todo = {}, [(explorer.pictures["sampling"], 0)]
    while todo:
        stack, depth = todo.pop()
        by_depth.setdefault(depth, []).append(stack)
        todo += [(s, depth + 1) for s in stack.children if isinstance(s, widgets.Stack)]
    assert [len(v) for _, v in sorted(by_depth.items())] == [1, 2, 4]
    assert len(explorer.links) == 2 * 7  # the wide and the narrow frames
    for depth, stacks in by_depth.items():
        for stack in stacks:
            found = [link for link in explorer.links if link.target == (stack, "selected_index")]
            assert len(found) == 1 and found[0].source == controls[depth]


@pytest.mark.parametrize("t, k, p", [(1, 0, 0), (1, 1, 1), (1, 0, 1), (0, 1, 0)])
def test_frame_is_the_renderer_s_picture_of_that_rule(explorer, bundled, t, k, p):
    """The frame under the controls' indices is what the renderer draws for that rule, the
    logits are the model's for the prompt, and the continuation is what generate_text draws
    with that rule and seed."""
    model, tokenizer = bundled
    rule = (TEMPERATURES[t], TOP_KS[k], TOP_PS[p])
    with torch.no_grad():
        logits = model(tokenizer.encode(PROMPT)[None])[0, -1]  # (V,)
    torch.testing.assert_close(explorer.logits, logits, atol=0, rtol=0)
    text = generate_text(model, tokenizer, PROMPT, N_NEW, temperature=rule[0], top_k=rule[1],
                         top_p=rule[2], seed=SEED)
    assert explorer.continuations[rule] == text[len(PROMPT):]
    expected = _sampling_frames(logits, tokenizer.chars, PROMPT, [rule], [text[len(PROMPT):]],
                                  SEED)[0]
    assert _frame(explorer, t, k, p) == expected
    other = (1.0, None, None) if rule != (1.0, None, None) else (1.0, 3, None)
    assert _frame(explorer, t, k, p) != _sampling_frames(
        logits, tokenizer.chars, PROMPT, [other], [text[len(PROMPT):]], SEED)[0]


@pytest.mark.parametrize("rule", [(0.0, None, None), (0.5, None, None), (1.0, 3, None),
                                  (1.0, None, 0.9), (1.5, 10, 0.6), (0.8, 2, 0.9)])
def test_bars_are_the_rule_written_out(explorer, rule):
    before, after = _sampling_bars(explorer.logits, rule)
    np.testing.assert_allclose(after.numpy(), _reference_probs(explorer.logits, *rule),
                               atol=1e-6, rtol=0)  # fp32 softmax
    np.testing.assert_allclose(before.numpy(), _reference_probs(explorer.logits, rule[0],
                                                                None, None), atol=1e-6, rtol=0)


def test_sampled_characters_come_from_the_kept_set(explorer, bundled):
    """Each character of the top-3 continuation is among the 3 most likely at its step
    (one teacher-forced pass), and the greedy one is the argmax at every step."""
    model, tokenizer = bundled
    for rule in [(1.0, 3, None), (0.0, None, None)]:
        ids = tokenizer.encode(PROMPT + explorer.continuations[rule])[None]  # (1, P + N)
        with torch.no_grad():
            z = model(ids[:, :-1])[0, len(PROMPT) - 1:]  # (N, V): every step's logits
        chosen = ids[0, len(PROMPT):]  # (N,)
        rank = (z > z.gather(1, chosen[:, None])).sum(1)  # (N,): rank of the chosen one
        assert int(rank.max()) < (3 if rule[1] else 1)


def _bars(png: bytes) -> list[tuple[int, int]]:
    """(blue height, grey height) in pixels of each blue bar, left to right: runs of blue
    along the row just above the bars' common base, and the grey bar (drawn wider, behind
    it) just left of each run."""
    rgb = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(float)  # (h, w, 3)
    grey_rgb = (0.4 * np.array(to_rgb(GREY)) + 0.6) * 255  # GREY at alpha 0.4 on white
    blue = np.linalg.norm(rgb - np.array(to_rgb(BLUE)) * 255, axis=-1) < 12  # (h, w)
    grey = np.linalg.norm(rgb - grey_rgb, axis=-1) < 12  # (h, w)
    rows = np.flatnonzero(blue.sum(1))
    base = rows[blue[rows].sum(1) > 20].max()  # the lowest row with bars in it
    columns = np.flatnonzero(blue[base])
    starts = columns[np.r_[True, np.diff(columns) > 1]]
    return [(int(blue[: base + 1, c + 2].sum()), int(grey[: base + 1, c - 4].sum()))
            for c in starts]


def test_picture_shows_the_kept_bars_at_their_heights(explorer):
    """Read back from the pixels: one blue bar per kept character among those shown, and
    the first one as much taller than the grey bar behind it as renormalisation makes it."""
    for (t, k, p), kept in [((1, 0, 0), W.sampling.N_BARS), ((1, 1, 0), 3), ((1, 1, 1), 3),
                            ((0, 0, 0), 1)]:
        bars = _bars(_frame(explorer, t, k, p))
        assert len(bars) == kept
        before, after = _sampling_bars(explorer.logits,
                                         (TEMPERATURES[t], TOP_KS[k], TOP_PS[p]))
        top = int(after.argmax())
        (blue, grey) = bars[0]
        assert blue / grey == pytest.approx(float(after[top] / before[top]), abs=0.03)


def test_controls_start_at_temperature_one_and_move_by_keyboard(explorer):
    c = explorer.controls
    assert list(c) == ["temperature", "top_k", "top_p"]
    assert [label for label, _ in c["temperature"].options] == ["greedy", "1.0"]
    assert [label for label, _ in c["top_k"].options] == ["off", "3"]
    assert [label for label, _ in c["top_p"].options] == ["off", "0.9"]
    assert (c["temperature"].index, c["top_k"].index, c["top_p"].index) == (1, 0, 0)
    for control in c.values():
        assert isinstance(control, widgets.SelectionSlider) and control.description
        assert control.layout.flex == f"1 1 {W.CONTROL_WIDTH}" and control.layout.min_width == "0"
        assert control.style.description_width == "96px"  # wide enough for "temperature"
    assert isinstance(explorer, W.SamplingExplorer) and isinstance(explorer, W.Explorer)
    frames = images(explorer.pictures["sampling"])
    assert {leaf.layout.max_width for leaf in frames} == {f"{_png_width(_frame(explorer, 0, 0, 0))}px"}


def test_kernel_path_moves_the_picture_for_each_control(monkeypatch, bundled, explorer):
    monkeypatch.setattr(W.frames, "HAS_STACK", False)
    box = W.sampling_explorer(*bundled, prompt=PROMPT, temperatures=TEMPERATURES, top_ks=TOP_KS,
                              top_ps=TOP_PS, n_new=N_NEW, seed=SEED)
    picture, c = box.pictures["sampling"], box.controls
    assert isinstance(picture, widgets.Image) and box.links == []
    shown, todo = [], [box]
    while todo:
        shown.append(todo.pop())
        todo += list(getattr(shown[-1], "children", ()))
    assert not any(isinstance(w, widgets.Stack) for w in shown)
    for name, index in [("top_k", 1), ("top_p", 1), ("temperature", 0)]:
        before = bytes(picture.value)
        c[name].index = index
        assert bytes(picture.value) != before, f"moving {name} left the picture"
        now = (c["temperature"].index, c["top_k"].index, c["top_p"].index)
        assert bytes(picture.value) == _frame(explorer, *now)


def test_rejects_bad_arguments(bundled):
    model, tokenizer = bundled
    with pytest.raises(ValueError, match="both model and tokenizer"):
        W.sampling_explorer(model)
    with pytest.raises(ValueError, match=r"temperatures must hold 2 or more distinct .*\[1.0\]"):
        W.sampling_explorer(model, tokenizer, temperatures=(1.0,))
    with pytest.raises(ValueError, match="top_k"):
        W.sampling_explorer(model, tokenizer, top_ks=(None, 70))
    with pytest.raises(ValueError, match="top_p"):
        W.sampling_explorer(model, tokenizer, top_ps=(None, 1.5))
    with pytest.raises(ValueError, match="temperature"):
        W.sampling_explorer(model, tokenizer, temperatures=(-1.0, 1.0))
    with pytest.raises(ValueError, match=r"n_new >= 1, got 'MACBETH.', 0"):
        W.sampling_explorer(model, tokenizer, prompt="MACBETH.", n_new=0)
    with pytest.raises(ValueError, match=r"= 630 frames"):  # 70 × 3 × 3
        W.sampling_explorer(model, tokenizer, temperatures=[0.1 * i for i in range(1, 71)])


def test_page_weight_of_the_chapter_s_explorer(bundled):
    """The chapter's explorer (5 temperatures × 3 top-k × 3 top-p, 80 characters each),
    estimated from the embedded frames of its default rules at two temperatures: under
    1.5 MB of base64 in the page's widget state."""
    box = W.sampling_explorer(*bundled, temperatures=(1.0, 1.5))
    state = embed_data(views=[box], state=dependency_state(box))["manager_state"]["state"]
    images = [s for s in state.values() if s["model_name"] == "ImageModel"]
    assert len(images) == 2 * 2 * 3 * 3  # wide and narrow
    embedded = sum(len(b["data"]) for s in images for b in s["buffers"])  # base64 characters
    chapter = embedded * 5 / 2
    assert chapter < 1.5e6, f"the chapter's explorer would add {chapter / 1e6:.2f} MB"


def test_continuation_is_folded_into_the_text_box():
    """Long lines are wrapped at TEXT_COLUMNS, line breaks kept, and text beyond TEXT_LINES
    lines is cut with an ellipsis."""
    from transformer_lib.widgets.sampling import TEXT_COLUMNS, TEXT_LINES, _continuation_text

    short = _continuation_text("AB\nC", "D\n\nE")
    assert short == "AB\nCD\n\nE"
    long = _continuation_text("x", "y" * (TEXT_COLUMNS * (TEXT_LINES + 2)))
    lines = long.split("\n")
    assert len(lines) == TEXT_LINES and all(len(line) <= TEXT_COLUMNS for line in lines)
    assert lines[-1].endswith("…") and lines[0] == "x" + "y" * (TEXT_COLUMNS - 1)
