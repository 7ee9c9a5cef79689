"""The configs of the book's other builds, written from ``_config.yml``.

    python tools/zh_config.py en OUT.yml        # the English edition of `make book`
    python tools/zh_config.py zh OUT.yml        # the Chinese edition (published under zh/)
    python tools/zh_config.py gettext OUT.yml   # message extraction: nothing executed

``jupyter-book build --config`` replaces ``_config.yml`` rather than merging with it, so each
of these is a full copy of it with a few keys changed; ``_config.yml`` stays the only file a
person edits. Paths in it stay relative to the book's folder (Jupyter Book resolves them there,
wherever the config file lies), except the folders of local extensions, which Jupyter Book
looks for beside the config file: they are written as absolute paths.

- ``en`` and ``zh`` share one execute cache (``_build/.jupyter_cache``): the English build
  executes every notebook, the Chinese build reuses the executed notebooks. ``make book``
  (tools/build_book.py) empties the cache first, so every ``make book`` still executes every
  notebook once, after whatever changed in ``transformer_lib``.
- ``zh`` sets ``language: zh_CN`` and reads the translations from ``locales/zh_CN/LC_MESSAGES``
  (one catalog per page: ``gettext_compact: false``); a message without a translation, or a
  fuzzy one, is shown in English. Its pages live at ``html.baseurl`` + ``zh/``; their Colab
  and Binder buttons open the Chinese notebooks under ``zh/`` (``tools/zh_notebooks.py``),
  and they have no edit button (a translation is edited in the catalogs).
- ``gettext`` executes nothing (only the Markdown is extracted), so extraction takes seconds.
"""
from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "_config.yml"
CACHE = ROOT / "_build" / ".jupyter_cache"
LOCALES = "locales/"
LANGUAGE = "zh_CN"
ZH_FOLDER = "zh"  # where the Chinese edition lives under the English one
# The book's title in the Chinese edition (the page titles come from the catalogs; the
# introduction's title translates the same words).
TITLE = "从零实现 Transformer"
KINDS = ("en", "zh", "gettext")


def base_config(path: Path = CONFIG) -> dict[str, Any]:
    """The English config, as a dict.

    Args:
        path: the book's ``_config.yml``.

    Returns:
        The parsed YAML.
    """
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def edition_config(kind: str, base: dict[str, Any] | None = None,
                   cache: Path = CACHE) -> dict[str, Any]:
    """The config of one build, derived from the English one.

    Args:
        kind: ``"en"``, ``"zh"`` or ``"gettext"`` (see the module's docstring).
        base: the English config (default: ``_config.yml``'s); not modified.
        cache: the execute cache that ``en`` and ``zh`` share.

    Returns:
        A full config for ``jupyter-book build --config``.

    Raises:
        ValueError: if ``kind`` is not one of ``KINDS``.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
    config = copy.deepcopy(base if base is not None else base_config())
    # Jupyter Book finds local extensions relative to the config file, which is not in the
    # book's folder here: give their folders as absolute paths.
    local = config.setdefault("sphinx", {}).get("local_extensions") or {}
    for name, folder in local.items():
        local[name] = str(ROOT / folder)
    execute = config.setdefault("execute", {})
    if kind == "gettext":
        execute["execute_notebooks"] = "off"
        # One template per page (the catalogs follow: locales/zh_CN/LC_MESSAGES/<page>.po).
        sphinx = config.setdefault("sphinx", {})
        sphinx["recursive_update"] = True
        sphinx.setdefault("config", {})["gettext_compact"] = False
        return config
    execute["execute_notebooks"] = "cache"
    execute["cache"] = str(cache)
    if kind == "en":
        return config
    # The launch buttons open the Chinese notebooks (tools/zh_notebooks.py); the English
    # source is not where a translation is edited, so there is no edit button.
    config.setdefault("repository", {})["path_to_book"] = ZH_FOLDER
    config["title"] = TITLE
    html = config.setdefault("html", {})
    html["use_edit_page_button"] = False
    if html.get("baseurl"):
        html["baseurl"] = html["baseurl"].rstrip("/") + f"/{ZH_FOLDER}/"
    sphinx = config.setdefault("sphinx", {})
    # Merge these keys into Jupyter Book's defaults instead of replacing them.
    sphinx["recursive_update"] = True
    # Search that finds Chinese words (characters and bigrams, no word list): _ext/zh_search.py.
    sphinx.setdefault("local_extensions", {})["zh_search"] = str(ROOT / "_ext")
    # The explorers' captions, control names and option labels: _ext/zh_widgets.py.
    sphinx["local_extensions"]["zh_widgets"] = str(ROOT / "_ext")
    sphinx_config = sphinx.setdefault("config", {})
    sphinx_config.update(language=LANGUAGE, locale_dirs=[LOCALES], gettext_compact=False)
    return config


def write(kind: str, out: Path) -> Path:
    """Write the config of ``kind`` to ``out`` (folders made as needed).

    Args:
        kind: one of ``KINDS``.
        out: the YAML file to write.

    Returns:
        ``out``.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    text = (f"# Written by tools/zh_config.py {kind} from _config.yml: edit _config.yml.\n"
            + yaml.safe_dump(edition_config(kind), allow_unicode=True, sort_keys=False))
    out.write_text(text, encoding="utf-8")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=KINDS)
    parser.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    print(write(args.kind, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
