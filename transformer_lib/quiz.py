"""The keys of the book's numeric self-check questions.

A numeric quiz in a page (``{quiz}`` with ``:key: NAME``) takes its key from the value the
page's ``quiz-keys`` cell publishes with :func:`quiz_key`, computed there by the library, so a
quiz can never show a key that the library does not give. When the book is built (myst-nb is
installed) the value is glued into the page; in Jupyter, Colab or Binder it is printed, so
a reader who runs the cell sees the keys.
"""
from __future__ import annotations

import math
from numbers import Real

__all__ = ["quiz_key"]


def quiz_key(name: str, value: float) -> float:
    """Publish ``value`` as the key of the page's numeric quiz ``name`` and return it.

    Glued with ``myst_nb.glue(name, value, display=False)`` where myst-nb is installed (the
    book build), printed as ``name = value`` elsewhere.

    Raises:
        ValueError: ``name`` is not an identifier, or ``value`` is not a finite real number.
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"a quiz key's name must be an identifier, got {name!r}")
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise ValueError(f"the key {name!r} must be a finite number, got {value!r}")
    try:
        from myst_nb import glue
    except ImportError:  # Jupyter, Colab, Binder: no book to glue into
        print(f"{name} = {value}")
    else:
        glue(name, value, display=False)
    return value
