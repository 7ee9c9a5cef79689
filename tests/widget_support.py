"""Walking an explorer's widget tree (``transformer_lib.widgets``), for the widget tests."""
from __future__ import annotations

import ipywidgets as widgets

from transformer_lib.widgets.frames import FRAME_CLASS


def every_widget(widget: widgets.Widget) -> list[widgets.Widget]:
    """``widget`` and everything under it, parents before their children."""
    return [widget] + [w for child in getattr(widget, "children", ()) for w in every_widget(child)]


def every_model(box: widgets.Widget) -> list[widgets.Widget]:
    """Every widget model an explorer makes: its widgets and its browser-side links."""
    return every_widget(box) + list(getattr(box, "links", []))


def images(widget: widgets.Widget) -> list[widgets.Image]:
    """The picture frames under ``widget``, in order."""
    return [w for w in every_widget(widget) if isinstance(w, widgets.Image)]


def text_frames(widget: widgets.Widget) -> list[widgets.HTML]:
    """The text frames under ``widget`` (HTML of class ``FRAME_CLASS``), in order."""
    return [w for w in every_widget(widget)
            if isinstance(w, widgets.HTML) and FRAME_CLASS in w._dom_classes]


def stacks_by_depth(stack: widgets.Stack) -> dict[int, list[widgets.Stack]]:
    """The Stacks nested in ``stack`` (itself at depth 0), by depth, in order."""
    out: dict[int, list[widgets.Stack]] = {}

    def visit(node: widgets.Stack, depth: int) -> None:
        out.setdefault(depth, []).append(node)
        for child in node.children:
            if isinstance(child, widgets.Stack):
                visit(child, depth + 1)

    visit(stack, 0)
    return out
