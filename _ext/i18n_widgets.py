"""The explorers' own text in a translated edition: captions, control names, option labels.

An explorer's words are not in the page's Markdown but in the saved state of its widgets,
which the executed notebook carries and the page embeds as a ``<script type="application/
vnd.jupyter.widget-state+json">``. A translated edition reuses the source edition's executed
notebooks, so that state is English. This extension translates it as each page of a
translated edition is written, from one catalog, ``locales/<code>/LC_MESSAGES/widgets.po``,
whose messages are the exact strings of the source pages' widget states (``python tools/i18n
messages update`` extracts them from the built source edition).

What is translated (``widget_texts``): a widget's ``description``, ``placeholder`` and
``tooltip``; an accordion's or tab's titles; a menu's or selection slider's option labels; the
text of an ``HTML`` or ``Label`` widget, except the explorers' frames (class ``explorer-frame``:
the numbers under each picture, which stay as drawn, like the figures' labels). The values a
control selects do not change, only the labels shown, so the explorers' links still hold.
A string without a translation (or with a fuzzy one) stays English.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

STATE_TYPE = "application/vnd.jupyter.widget-state+json"
FRAME_CLASS = "explorer-frame"  # transformer_lib.widgets.frames.FRAME_CLASS
CATALOG = "widgets.po"  # in each language's LC_MESSAGES (tools/i18n/messages.py, WIDGETS)

_TEXT_MODELS = ("HTMLModel", "HTMLMathModel", "LabelModel")
_SINGLE = ("description", "placeholder", "tooltip")
_LISTS = ("_options_labels", "_titles", "titles")


def _worth_translating(text: Any) -> bool:
    """A string with a letter in it (not a number, not the zero-width space of a blank HTML)."""
    return isinstance(text, str) and any(ch.isalpha() for ch in text)


def widget_texts(state: dict[str, Any]) -> Iterator[tuple[dict, str, int | None]]:
    """Where an explorer's words are in a saved widget state.

    Args:
        state: the ``state`` mapping of a widget-state JSON (model id -> model).

    Yields:
        ``(model_state, key, index)``: the text is ``model_state[key]`` when ``index`` is None,
        else ``model_state[key][index]``.
    """
    for model in state.values():
        fields = model.get("state", {})
        for key in _SINGLE:
            if _worth_translating(fields.get(key)):
                yield fields, key, None
        for key in _LISTS:
            for index, text in enumerate(fields.get(key) or []):
                if _worth_translating(text):
                    yield fields, key, index
        if (model.get("model_name") in _TEXT_MODELS and _worth_translating(fields.get("value"))
                and FRAME_CLASS not in (fields.get("_dom_classes") or [])):
            yield fields, "value", None


def _get(fields: dict, key: str, index: int | None) -> str:
    return fields[key] if index is None else fields[key][index]


def strings(state: dict[str, Any]) -> list[str]:
    """The explorers' words in a widget state, each once, in the order found."""
    return list(dict.fromkeys(_get(*where) for where in widget_texts(state)))


def translate_state(state: dict[str, Any], translate: Callable[[str], str]) -> int:
    """Translate the explorers' words of a widget state in place.

    Args:
        state: as in ``widget_texts``.
        translate: a string's translation (the string itself when there is none).

    Returns:
        How many strings changed.
    """
    changed = 0
    for fields, key, index in list(widget_texts(state)):
        text = _get(fields, key, index)
        new = translate(text)
        if new != text:
            if index is None:
                fields[key] = new
            else:
                fields[key] = list(fields[key])
                fields[key][index] = new
            changed += 1
    return changed


def page_state(html: str) -> dict[str, Any] | None:
    """The widget state embedded in a written page, if it has one."""
    start = html.find(f'<script type="{STATE_TYPE}">')
    if start < 0:
        return None
    start = html.index(">", start) + 1
    return json.loads(html[start:html.index("</script>", start)])


def _translate_page(app: Any, pagename: str, templatename: str, context: dict,
                    doctree: Any) -> None:
    translations = getattr(app, "i18n_widget_translations", None)
    if not translations:
        return
    for script in context.get("script_files") or []:
        attributes = getattr(script, "attributes", None) or {}
        if attributes.get("type") != STATE_TYPE or not attributes.get("body"):
            continue
        data = json.loads(attributes["body"])
        if translate_state(data.get("state", {}), lambda text: translations.get(text, text)):
            # As myst-nb writes it: no "</" inside a script element.
            attributes["body"] = json.dumps(data).replace("</", "<\\/")


def _load(app: Any) -> None:
    """The translations of this edition's explorers' words (none in the source edition)."""
    from i18n_editions import edition_catalog

    app.i18n_widget_translations = edition_catalog(app, CATALOG)


def setup(app: Any) -> dict:
    app.setup_extension("i18n_editions")  # the list of languages
    app.connect("builder-inited", _load)
    # After myst-nb has added the page's widget state (default priority), before the book's
    # duplicate-script filter (900).
    app.connect("html-page-context", _translate_page, priority=800)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
