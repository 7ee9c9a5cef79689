"""An explorer shows its first picture before any script runs.

An explorer is drawn by the ipywidgets HTML manager (about 3.6 MB of JavaScript, loaded with
``defer`` so that the text is shown first) from the widget state that the page embeds. Until
then its place on the page is empty. This extension writes, for each explorer, the picture it
opens on as a plain image (``div.explorer-placeholder``, its wide and its narrow frame) where
the explorer will be drawn, with the explorer's caption and the frame's readout as alt text.
The pictures are found in the embedded state: from the view's root widget down the children,
through each ``Stack`` at its selected index, to the first picture of each set (an
``Image``), the frame that the live explorer shows first. book.css hides the placeholder
once the live widget is in the same output (``.cell_output:has(.jupyter-widgets)``), so a
reader without scripts keeps the picture and a reader with them gets the explorer in its
place. Printed, a page shows the placeholder instead of the live explorer.

A frame that is text (an explorer whose frames are HTML, class ``explorer-frame``) is written
as that HTML in a ``div.explorer-placeholder``.
"""
from __future__ import annotations

import base64
import html
import json
import re
from collections.abc import Iterator
from typing import Any

from sphinx.application import Sphinx

STATE_TYPE = "application/vnd.jupyter.widget-state+json"
# transformer_lib.widgets.frames: text frames, and a picture's wide and narrow (phone) sets
FRAME_CLASS = "explorer-frame"
WIDE_CLASS = "explorer-wide"
NARROW_CLASS = "explorer-narrow"
PLACEHOLDER_CLASS = "explorer-placeholder"
_MODEL_REFERENCE = "IPY_MODEL_"
# myst-nb writes one of these where each widget's view goes.
_VIEW = re.compile(
    r'<script type="application/vnd\.jupyter\.widget-view\+json">(.*?)</script>', re.S)


def _model(state: dict[str, Any], reference: Any) -> dict[str, Any] | None:
    if not isinstance(reference, str):
        return None
    return state.get(reference.removeprefix(_MODEL_REFERENCE))


def _walk(state: dict[str, Any], model: dict[str, Any], narrow: bool = False
          ) -> Iterator[tuple[dict[str, Any], bool]]:
    """The widgets a reader sees first, in page order, each with whether it belongs to a
    picture's narrow set of frames (class ``NARROW_CLASS``): every child of a box, and only
    the selected child of a ``Stack``."""
    fields = model.get("state", {})
    narrow = narrow or NARROW_CLASS in (fields.get("_dom_classes") or [])
    yield model, narrow
    children = fields.get("children") or []
    if model.get("model_name") == "StackModel":
        index = fields.get("selected_index")
        shown = isinstance(index, int) and 0 <= index < len(children)
        children = [children[index]] if shown else []
    for reference in children:
        child = _model(state, reference)
        if child is not None:
            yield from _walk(state, child, narrow)


def _image_source(model: dict[str, Any]) -> str | None:
    """A data: address of an ``Image`` widget's picture (its value is a binary buffer)."""
    image_format = model["state"].get("format", "png")
    for buffer in model.get("buffers") or []:
        if buffer.get("path") == ["value"] and buffer.get("encoding") == "base64":
            base64.b64decode(buffer["data"], validate=True)  # a corrupt state fails the build
            return f"data:image/{image_format};base64,{buffer['data']}"
    return None


def _text(markup: str) -> str:
    """The words of an HTML fragment, on one line: a block or a line break is a space, an
    inline element is nothing (d<sub>k</sub> is "dk")."""
    spaced = re.sub(r"<(?:br|/?(?:div|p|li|tr|td|th|table))\b[^>]*>", " ", markup, flags=re.I)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", spaced)).split())


def placeholder(state: dict[str, Any], model_id: str) -> str | None:
    """The HTML that stands for the widget ``model_id`` before it is drawn.

    For an explorer with pictures: a ``div.explorer-placeholder`` holding its first picture
    (an ``img`` of class ``WIDE_CLASS``) and, where the explorer has a narrow set of frames
    for phones, the first of those (class ``NARROW_CLASS``; book.css shows the one that the
    live explorer would show at that width). Their alt text is the explorer's caption (its
    first text, which says what the pictures show) followed by the readout of this frame (the
    first text frame after the picture, which gives its numbers). For an explorer without
    pictures, its first text frame. None for a widget that has neither."""
    root = state.get(model_id)
    if root is None:
        return None
    caption = readout = None
    pictures: dict[bool, str] = {}  # narrow? -> the first picture of that set
    for model, narrow in _walk(state, root):
        name = model.get("model_name")
        fields = model.get("state", {})
        words = _text(fields.get("value", "")) if name == "HTMLModel" else ""
        if name == "HTMLModel" and FRAME_CLASS in (fields.get("_dom_classes") or []):
            if not pictures:
                return f'<div class="{PLACEHOLDER_CLASS}">{fields.get("value", "")}</div>'
            readout = readout or words
        elif words:
            caption = caption or words
        elif name == "ImageModel" and narrow not in pictures:
            if source := _image_source(model):
                pictures[narrow] = source
    if False not in pictures:
        return None
    alt = html.escape(" ".join(part for part in (caption, readout) if part)
                      or "explorer picture", quote=True)
    images = "".join(f'<img class="{NARROW_CLASS if narrow else WIDE_CLASS}" src="{source}" '
                     f'alt="{alt}">' for narrow, source in sorted(pictures.items()))
    return f'<div class="{PLACEHOLDER_CLASS}">{images}</div>'


def page_state(context: dict) -> dict[str, Any] | None:
    """The widget state a page embeds (``state``: model id -> model), if it has one."""
    for script in context.get("script_files") or []:
        attributes = getattr(script, "attributes", None) or {}
        if attributes.get("type") == STATE_TYPE and attributes.get("body"):
            return json.loads(attributes["body"]).get("state", {})
    return None


def add_placeholders(app: Sphinx, pagename: str, templatename: str, context: dict,
                     doctree: Any) -> None:
    """Write each explorer's first picture before the script element of its view. Runs after
    the explorers' words are translated (``i18n_widgets``, priority 800)."""
    body = context.get("body")
    state = page_state(context) if body else None
    if not state:
        return

    def with_placeholder(match: re.Match) -> str:
        view = json.loads(match.group(1))
        standin = placeholder(state, view.get("model_id", ""))
        return (standin or "") + match.group(0)

    context["body"] = _VIEW.sub(with_placeholder, body)


def setup(app: Sphinx) -> dict:
    app.connect("html-page-context", add_placeholders, priority=850)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
