"""Every word a checker shows a student goes through :func:`say`: the verdict's head, each
case's title, each failure and its hint, the known mistakes and the guard's refusals.

A message is written once, as an English template with named placeholders
(``"row {row} sums to {total:.4f}, not 1"``), and filled from keyword arguments. The template
is the key of a translation: :data:`CATALOG` maps an English template to the same message in
another language, with the same placeholders, so an edition in another language adds a
catalog and changes no checker. With the catalog empty, as here, a checker speaks English.
Some checkers build their tables of known mistakes when they are imported, so a catalog is
put in place before ``transformer_lib.checks`` is first imported.

The rules that keep the templates extractable (``tests/test_messages.py`` enforces them): the
first argument of ``say`` is a string literal, never a variable or an f-string; its
placeholders are named (no ``{}`` or ``{0}``), and are exactly the keywords the call passes.
"""
from __future__ import annotations

from typing import Any

#: English template -> the template in the reader's language (same placeholders). Empty: English.
CATALOG: dict[str, str] = {}


def say(template: str, /, **values: Any) -> str:
    """The message ``template`` in the reader's language, its placeholders filled.

    Args:
        template: the English message, a string literal with ``{name}`` placeholders, which
            may carry a format (``{loss:.4f}``) or a conversion (``{name!r}``).
        **values: one keyword per placeholder.

    Returns:
        The message, from :data:`CATALOG` where it holds the template, else the English.
    """
    return CATALOG.get(template, template).format(**values)


__all__ = ["CATALOG", "say"]
