"""The config of every build of the book, written from ``_config.yml``.

    python tools/i18n config en OUT.yml        # the source (English) edition of `make book`
    python tools/i18n config zh OUT.yml        # a translated edition, by its folder
    python tools/i18n config gettext OUT.yml   # message extraction: nothing executed

``jupyter-book build --config`` replaces ``_config.yml`` rather than merging with it, so each
of these is a full copy of it with a few keys changed; ``_config.yml`` stays the only file a
person edits. Paths in it stay relative to the book's folder (Jupyter Book resolves them there,
wherever the config file lies), except the folders of local extensions, which Jupyter Book
looks for beside the config file: they are written as absolute paths.

- Every edition shares one execute cache (``_build/.jupyter_cache``): the source edition
  executes every notebook, the translated ones reuse the executed notebooks. ``make book``
  (tools/build_book.py) empties the cache first, so every ``make book`` still executes every
  notebook once, after whatever changed in ``transformer_lib``.
- A translated edition sets ``language`` to its code and reads the translations from
  ``locales/<code>/LC_MESSAGES`` (one catalog per page: ``gettext_compact: false``); a message
  without a translation, or a fuzzy one, is shown in the source language. Its pages live at
  ``html.baseurl`` + ``<folder>/``; their Colab and Binder buttons open its notebooks under
  ``<folder>/`` (``tools/i18n/notebooks.py``), and they have no edit button (a translation is
  edited in the catalogs).
- ``gettext`` executes nothing (only the Markdown is extracted), so extraction takes seconds.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from i18n.languages import ROOT, base_config, languages

CACHE = ROOT / "_build" / ".jupyter_cache"
LOCALES = "locales/"
EXTRACTION = "gettext"


def kinds(base: dict[str, Any] | None = None) -> tuple[str, ...]:
    """What ``edition_config`` writes: every edition by name, then ``gettext``."""
    return (*(language.edition for language in languages(base)), EXTRACTION)


def edition_config(kind: str, base: dict[str, Any] | None = None,
                   cache: Path = CACHE) -> dict[str, Any]:
    """The config of one build, derived from the source edition's.

    Args:
        kind: an edition's name (``Language.edition``: ``"en"``, ``"zh"``) or ``"gettext"``
            (see the module's docstring).
        base: the source edition's config (default: ``_config.yml``'s); not modified.
        cache: the execute cache that every edition shares.

    Returns:
        A full config for ``jupyter-book build --config``.

    Raises:
        ValueError: if ``kind`` is not one of ``kinds(base)``.
    """
    config = copy.deepcopy(base if base is not None else base_config())
    found = languages(config)
    if kind not in kinds(config):
        raise ValueError(f"kind must be one of {kinds(config)}, not {kind!r}")
    # Jupyter Book finds local extensions relative to the config file, which is not in the
    # book's folder here: give their folders as absolute paths.
    local = config.setdefault("sphinx", {}).get("local_extensions") or {}
    for name, folder in local.items():
        local[name] = str(ROOT / folder)
    execute = config.setdefault("execute", {})
    if kind == EXTRACTION:
        execute["execute_notebooks"] = "off"
        # One template per page (the catalogs follow: locales/<code>/LC_MESSAGES/<page>.po).
        sphinx = config.setdefault("sphinx", {})
        sphinx["recursive_update"] = True
        sphinx.setdefault("config", {})["gettext_compact"] = False
        return config
    execute["execute_notebooks"] = "cache"
    execute["cache"] = str(cache)
    language = next(language for language in found if language.edition == kind)
    if language is found[0]:
        return config
    # The launch buttons open the edition's notebooks (tools/i18n/notebooks.py); the source
    # is not where a translation is edited, so there is no edit button.
    config.setdefault("repository", {})["path_to_book"] = language.folder
    config["title"] = language.title
    html = config.setdefault("html", {})
    html["use_edit_page_button"] = False
    if html.get("baseurl"):
        html["baseurl"] = html["baseurl"].rstrip("/") + f"/{language.folder}/"
    sphinx = config.setdefault("sphinx", {})
    # Merge these keys into Jupyter Book's defaults instead of replacing them.
    sphinx["recursive_update"] = True
    sphinx.setdefault("config", {}).update(
        language=language.code, locale_dirs=[LOCALES], gettext_compact=False)
    return config


def write(kind: str, out: Path) -> Path:
    """Write the config of ``kind`` to ``out`` (folders made as needed).

    Args:
        kind: one of ``kinds()``.
        out: the YAML file to write.

    Returns:
        ``out``.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    text = (f"# Written by tools/i18n config {kind} from _config.yml: edit _config.yml.\n"
            + yaml.safe_dump(edition_config(kind), allow_unicode=True, sort_keys=False))
    out.write_text(text, encoding="utf-8")
    return out
