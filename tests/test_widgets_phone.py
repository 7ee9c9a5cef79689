"""Explorers on a phone: the pictures a 390 px phone shows have text of at least
``PHONE_TEXT_PX`` (9) CSS px.

A phone's content column is ``PHONE_COLUMN`` (358) CSS px (measured in the browser). A frame
is shown at its natural width (one pixel per CSS pixel) or the column's, whichever is less,
so its text shrinks by ``min(1, PHONE_COLUMN / width)``. A picture wider than a phone has a
narrow set of frames (``Explorer.narrow``) that the book shows there instead: the smallest
text the renderer drew on those frames (``text_px``), at that scale, must be 9 px or more.
A picture without a narrow set (RoPE's two pictures, one above the other on a phone; the
attention maps, drawn with text large enough for both widths) is held to the same rule as
it is. ``tests/test_browser.py`` checks in the browser that a phone
shows the narrow sets at that scale and a desktop the wide ones.
"""
import ipywidgets as widgets
import pytest
import torch
from widget_support import every_widget, images

from transformer_lib import widgets as W
from transformer_lib.encoder_decoder import EncoderDecoder, EncoderDecoderConfig
from transformer_lib.plotting.style import PHONE_COLUMN, PHONE_TEXT_PX
from transformer_lib.widgets import frames as F
from transformer_lib.widgets.frames import _png_width

pytestmark = pytest.mark.figures


def _model() -> EncoderDecoder:
    torch.manual_seed(0)
    config = EncoderDecoderConfig(11, 11, d_model=16, n_heads=1, n_layers=1, d_ff=16,
                                  max_seq_len=64)
    return EncoderDecoder(config).eval()


# Each explorer with the chapter's layout (attention: the chapter's 8 steps) and few frames.
EXPLORERS = {
    "softmax": lambda: W.softmax_explorer(dims=(1, 1024), n_keys=8),
    "attention": lambda: W.attention_explorer(_model(), n_examples=1, seq_len=8),
    "heads": lambda: W.heads_explorer(heads=[1, 8], n_examples=1),
    "gradient": lambda: W.gradient_explorer(),
    "rope": lambda: W.rope_explorer(head_dim=4, n_positions=2),
    "sampling": lambda: W.sampling_explorer(temperatures=(0.0, 1.0), top_ks=(None, 3),
                                            top_ps=(None, 0.9)),
    "kv_memory": lambda: W.kv_memory_explorer(),
    "online_softmax": lambda: W.online_softmax_explorer(n_keys=24, tile_sizes=(3, 8)),
    "recall": lambda: W.recall_explorer(n_pairs=(8, 128), alphas=(0.9, 1.0), trials=8, n=8,
                                        alpha=0.9),
}


@pytest.fixture(scope="module", params=list(EXPLORERS))
def explorer(request):
    return request.param, EXPLORERS[request.param]()


def _phone_text_px(picture: widgets.Widget) -> tuple[float, int]:
    """The smallest text of ``picture``'s frames in CSS px on a 390 px phone, and the frames'
    natural width."""
    width = _png_width(bytes(images(picture)[0].value))
    return picture.text_px * min(1.0, PHONE_COLUMN / width), width


def test_every_picture_a_phone_shows_has_text_of_9_px_or_more(explorer):
    name, box = explorer
    drawn = {k: p for k, p in box.pictures.items() if images(p)}  # PNG frames, not text
    if name == "kv_memory":
        assert not drawn and not box.narrow  # text frames only: the browser test sizes them
        return
    assert drawn, f"{name}: no picture"
    for key, picture in drawn.items():
        shown = box.narrow.get(key, picture)
        px, width = _phone_text_px(shown)
        assert px != float("inf"), f"{name}.{key}: no text measured"
        assert px >= PHONE_TEXT_PX, (
            f"{name}.{key}: smallest text {px:.1f} px on a phone (frames {width} px wide, "
            f"text {shown.text_px:.1f} px in them)")


def test_narrow_sets_are_about_a_phone_s_column_wide(explorer):
    """A narrow set replaces wide frames whose text would be under 9 px on a phone, or that
    would shrink to less than two thirds there; its frames are about a phone's column wide."""
    name, box = explorer
    for key, picture in box.pictures.items():
        if key not in box.narrow:
            continue
        px, width = _phone_text_px(picture)
        assert px < PHONE_TEXT_PX or width > PHONE_COLUMN * 1.5, (
            f"{name}.{key}: a narrow set it does not need ({px:.1f} px without it)")
        narrow_width = _png_width(bytes(images(box.narrow[key])[0].value))
        assert 250 <= narrow_width <= F.NARROW_WIDTH * W.DPI


def test_narrow_set_is_hidden_but_for_the_book_s_phone_style_and_follows_the_controls(explorer):
    name, box = explorer
    assert F.EXPLORER_CLASS in box._dom_classes
    shown = every_widget(box)
    for key, narrow in box.narrow.items():
        wide = box.pictures[key]
        assert F.WIDE_CLASS in wide._dom_classes and F.NARROW_CLASS in narrow._dom_classes
        assert narrow.layout.display == "none" and wide.layout.display != "none"
        assert any(w is narrow for w in shown), f"{name}.{key}: the narrow set is not shown"
        assert len(images(narrow)) == len(images(wide))
        # The same controls drive both sets, level by level.
        sources = {id(link.target[0]): link.source for link in box.links}
        for a, b in zip(_stacks(wide), _stacks(narrow)):
            assert sources[id(a)] == sources[id(b)]


def _stacks(picture: widgets.Widget) -> list[widgets.Stack]:
    return [w for w in every_widget(picture) if isinstance(w, widgets.Stack)]


def test_without_stack_only_the_wide_set_is_drawn(monkeypatch):
    """The kernel path (ipywidgets 7, Colab) shows one picture: the wide frames."""
    monkeypatch.setattr(F, "HAS_STACK", False)
    box = EXPLORERS["softmax"]()
    assert box.narrow == {}
    assert len([w for w in every_widget(box) if isinstance(w, widgets.Image)]) == 1


def test_render_frames_notes_the_smallest_text_drawn():
    """Static text, text drawn in a frame and tick labels count; blank titles do not."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(3, 2), dpi=W.DPI)
    ax = fig.add_subplot()
    ax.tick_params(labelsize=11)
    ax.set_title(" ", fontsize=4)  # blank: not drawn as text
    label = ax.text(0.5, 0.5, "", fontsize=8, animated=True)

    def draw(k: int):
        label.set_text(f"frame {k}")
        return [label]

    frames = F._render_frames(fig, 2, draw)
    assert len(frames) == 2 and frames.text_px == pytest.approx(8 * W.DPI / 72)
