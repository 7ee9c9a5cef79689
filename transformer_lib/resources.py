"""The one reader of the files bundled in ``transformer_lib/data/`` (a text, small saved
results, a checkpoint): they install with the library, so they load the same way from a
checkout, a wheel or Colab."""
from __future__ import annotations

import json
from importlib import resources
from importlib.abc import Traversable
from typing import Any

__all__ = ["data_file", "load_json"]


def data_file(name: str) -> Traversable:
    """The bundled file ``transformer_lib/data/<name>``.

    Args:
        name: the file's name in ``transformer_lib/data/``.

    Returns:
        The file, an importlib ``Traversable`` (``read_text``, ``read_bytes``, ``open``).

    Raises:
        ValueError: ``name`` is not a bundled file (the message names those there).
    """
    folder = resources.files("transformer_lib").joinpath("data")
    path = folder.joinpath(name)
    if not path.is_file():
        found = sorted(p.name for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []
        raise ValueError(f"no bundled data file {name!r}; transformer_lib/data has {found}")
    return path


def load_json(name: str) -> Any:
    """The bundled JSON file ``transformer_lib/data/<name>``, parsed.

    Args:
        name: the file's name in ``transformer_lib/data/``.

    Returns:
        The parsed JSON (dicts, lists, numbers, strings).
    """
    return json.loads(data_file(name).read_text(encoding="utf-8"))
