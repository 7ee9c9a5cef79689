"""_ext/explorer_placeholders.py: the picture an explorer opens on, written into the page
before any script runs, is the frame the live explorer shows first, with its caption as alt
text."""
from __future__ import annotations

import base64
import importlib.util
import re
from pathlib import Path
from types import SimpleNamespace

import ipywidgets as widgets
import pytest
from ipywidgets.embed import embed_data

from transformer_lib import widgets as W

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "explorer_placeholders", ROOT / "_ext" / "explorer_placeholders.py")
placeholders = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(placeholders)

PNG = [bytes([137, 80, 78, 71, 13, 10, 26, 10]) + bytes([n]) * 8 for n in range(4)]


def _state(root: widgets.Widget) -> dict:
    """The widget state a built page embeds for ``root`` (binary buffers as base64)."""
    return embed_data(views=[root], drop_defaults=False)["manager_state"]["state"]


def _src(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


def _toy(selected: int) -> widgets.VBox:
    """As transformer_lib's explorers: a caption, controls, a Stack of pictures and under it a
    Stack of readouts (text frames), one per picture."""
    pictures = widgets.Stack([widgets.Image(value=p, format="png") for p in PNG[:3]],
                             selected_index=selected)
    readouts = [widgets.HTML(f"<b>d</b> = {4 ** n}: max &amp; more") for n in range(3)]
    for readout in readouts:
        readout.add_class(placeholders.FRAME_CLASS)
    return widgets.VBox([widgets.HTML("<b>The caption.</b> What the pictures show."),
                         widgets.IntSlider(), pictures,
                         widgets.Stack(readouts, selected_index=selected)])


@pytest.mark.parametrize("selected", [0, 2])
def test_the_placeholder_is_the_selected_frame_described_by_caption_and_readout(selected):
    root = _toy(selected)
    html = placeholders.placeholder(_state(root), root.model_id)
    assert html == (f'<div class="explorer-placeholder"><img class="explorer-wide" '
                    f'src="{_src(PNG[selected])}" alt="The caption. What the pictures show. '
                    f'd = {4 ** selected}: max &amp; more"></div>')


def test_nested_stacks_are_followed_at_their_selected_index():
    inner = [widgets.Stack([widgets.Image(value=PNG[2 * i + j], format="png") for j in (0, 1)],
                           selected_index=1) for i in (0, 1)]
    root = widgets.VBox([widgets.Stack(inner, selected_index=1), widgets.HTML("caption")])
    html = placeholders.placeholder(_state(root), root.model_id)
    assert f'src="{_src(PNG[3])}"' in html


def test_a_text_frame_is_written_as_its_html_and_a_widget_without_pictures_gets_none():
    frame = widgets.HTML("<div>cache 2 GB</div>")
    frame.add_class(placeholders.FRAME_CLASS)
    root = widgets.VBox([widgets.HTML("caption"), widgets.Stack([frame], selected_index=0)])
    assert placeholders.placeholder(_state(root), root.model_id) == \
        '<div class="explorer-placeholder"><div>cache 2 GB</div></div>'
    plain = widgets.VBox([widgets.IntSlider()])
    assert placeholders.placeholder(_state(plain), plain.model_id) is None
    assert placeholders.placeholder(_state(plain), "no-such-model") is None


def test_a_corrupt_picture_fails_the_build():
    root = _toy(0)
    state = _state(root)
    assert placeholders._text("d<sub>k</sub> = 1<br>spread<div>2</div>") == "dk = 1 spread 2"
    for model in state.values():
        for buffer in model.get("buffers", []):
            buffer["data"] = "not base64!"
    with pytest.raises(ValueError):
        placeholders.placeholder(state, root.model_id)


def test_the_page_gets_a_placeholder_before_each_view():
    """The Sphinx hook: the state from the page's scripts, a placeholder before each view."""
    import json

    root = _toy(1)
    state = {"version_major": 2, "version_minor": 0, "state": _state(root)}
    view = ('<script type="application/vnd.jupyter.widget-view+json">'
            f'{{"version_major": 2, "version_minor": 0, "model_id": "{root.model_id}"}}</script>')
    script = SimpleNamespace(filename=None, attributes={
        "type": placeholders.STATE_TYPE, "body": json.dumps(state).replace("</", "<\\/")})
    context = {"body": f"<p>text</p>{view}<p>more</p>", "script_files": [script]}
    placeholders.add_placeholders(None, "page", "page.html", context, None)
    assert context["body"] == (f'<p>text</p><div class="explorer-placeholder"><img '
                               f'class="explorer-wide" src="{_src(PNG[1])}" alt="The caption. '
                               f'What the pictures show. d = 4: max &amp; more"></div>'
                               f"{view}<p>more</p>")
    untouched = {"body": "<p>no widgets</p>", "script_files": []}
    placeholders.add_placeholders(None, "page", "page.html", untouched, None)
    assert untouched["body"] == "<p>no widgets</p>"


def _selected(picture: widgets.Widget) -> widgets.Image:
    while isinstance(picture, widgets.Stack):
        picture = picture.children[picture.selected_index]
    assert isinstance(picture, widgets.Image)
    return picture


@pytest.mark.figures
def test_a_real_explorer_opens_on_the_frames_its_controls_select():
    """softmax_explorer: the placeholder holds the pictures its wide and its narrow (phone)
    Stacks show at the controls' starting values, in that order; their alt text is the
    caption and the readout of that frame."""
    explorer = W.softmax_explorer(dims=(1, 16, 256), n_keys=8, seed=0)
    html = placeholders.placeholder(_state(explorer), explorer.model_id)
    wide, narrow = _selected(explorer.pictures["softmax"]), _selected(explorer.narrow["softmax"])
    assert wide.value != narrow.value
    sources = re.findall(r'<img class="explorer-(wide|narrow)" src="([^"]*)"', html)
    assert sources == [("wide", _src(wide.value)), ("narrow", _src(narrow.value))]
    alt = re.search(r'alt="([^"]*)"', html).group(1)
    assert alt.startswith("Scores, softmax and its gradient") and "spread" in alt, alt
