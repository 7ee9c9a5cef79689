"""The book's languages, as ``_config.yml`` lists them (``sphinx.config.book_languages``).

The first entry is the source language: its pages are the book's own files. Every other
entry is a translated edition, built from the same files and the gettext catalogs of
``locales/<code>/LC_MESSAGES``, published in the folder ``<folder>`` under the book's address,
with its notebooks in ``<folder>/chapters`` and ``<folder>/exercises``. What a script needs
beyond that is an option of its entry (see ``Language``), never a code path of one language.

The book's Sphinx extensions read the same list from their config (``_ext/i18n_editions.py``
registers it), so the two never disagree.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent.parent
CONFIG = ROOT / "_config.yml"
LOCALES = ROOT / "locales"

# Scripts a language entry may name (``script:``): the code points that count as its
# characters. They cut the edition's font (the CSS unicode-range of its @font-face is the same
# list) and let the tests check that a translated page reads in its language.
SCRIPTS: dict[str, list[tuple[int, int]]] = {
    "cjk": [
        (0x2E80, 0x2FDF),  # radicals
        (0x3000, 0x303F),  # CJK symbols and punctuation
        (0x3400, 0x4DBF),  # unified ideographs, extension A
        (0x4E00, 0x9FFF),  # unified ideographs
        (0xF900, 0xFAFF),  # compatibility ideographs
        (0xFF00, 0xFFEF),  # full-width forms (Chinese punctuation: ，：；（）)
    ],
}
# The letters of a script, without its punctuation: what a test looks for in a page's text.
LETTERS: dict[str, str] = {"cjk": "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"}
SEARCHES = ("bigram",)  # search: the kinds _ext/i18n_search.py provides


@dataclass(frozen=True)
class Font:
    """A subset font of a script, cut from one file of an npm package (tools/i18n/fonts.py).

    Attributes:
        file: the font the book serves, relative to the book's root (under a static folder).
        package: the npm package and version the source font comes from.
        source: the source font's path inside the package.
        licence: where the package's licence file is written, beside the font.
        family: the font's family name in ``_assets/book.css`` (its ``@font-face``).
    """

    file: str
    package: str
    source: str
    licence: str
    family: str


@dataclass(frozen=True)
class Termbase:
    """The glossary's column of a language's terms.

    Attributes:
        page: the glossary's source file, relative to the book's root.
        column: the heading of the column.
        font: a subset font of exactly the page's characters of the script, for the English
            edition's glossary (relative to the book's root).
    """

    page: str
    column: str
    font: str


@dataclass(frozen=True)
class Language:
    """One entry of ``book_languages``.

    Attributes:
        code: Sphinx's language (``en``, ``zh_CN``): the catalogs' folder under ``locales/``.
        label: the language switch's text, written in the language.
        hreflang: the page's language for browsers and search engines (``zh-CN``).
        folder: where the edition lives under the source edition (empty for the source).
        title: the book's title in the language.
        exercise: the student copies' exercise headings, ``heading`` (``{number}``) and
            ``titled`` (``{number}``, ``{title}``); empty keeps the English ones.
        complete: the pages whose translation must be finished (``true`` in the config: every
            page of the book, resolved by the caller), as paths without suffix.
        script: a key of ``SCRIPTS``, or empty.
        search: a key of ``SEARCHES``, or empty (Sphinx's own search for the language).
        font: the edition's subset font, or None (the readers' system fonts).
        termbase: the glossary's column of the language, or None.
    """

    code: str
    label: str
    hreflang: str
    folder: str = ""
    title: str = ""
    exercise: dict[str, str] = field(default_factory=dict)
    complete: bool | tuple[str, ...] = ()
    script: str = ""
    search: str = ""
    font: Font | None = None
    termbase: Termbase | None = None

    @property
    def edition(self) -> str:
        """The edition's name on the command line: its folder, or the source's code."""
        return self.folder or self.code

    @property
    def catalogs(self) -> Path:
        """The folder of the edition's catalogs, one ``<page>.po`` per page."""
        return LOCALES / self.code / "LC_MESSAGES"

    def letters(self) -> re.Pattern | None:
        """A pattern of one letter of the language's script (None without ``script``)."""
        return re.compile(f"[{LETTERS[self.script]}]") if self.script else None

    def in_script(self, text: str) -> str:
        """The distinct characters of ``text`` in the language's script, in code-point order."""
        ranges = SCRIPTS.get(self.script, [])
        return "".join(sorted({ch for ch in text
                               if any(lo <= ord(ch) <= hi for lo, hi in ranges)}))


_KEYS = {f for f in Language.__dataclass_fields__}


def parse(entry: dict[str, Any], source: bool = False) -> Language:
    """A ``Language`` from one entry of the config.

    Raises:
        ValueError: naming the entry and the key that is unknown, missing or wrong.
    """
    name = entry.get("code", entry)
    unknown = sorted(set(entry) - _KEYS)
    if unknown:
        raise ValueError(f"book_languages entry {name!r}: unknown keys {unknown}; "
                         f"known: {sorted(_KEYS)}")
    required = ("code", "label", "hreflang") if source else (
        "code", "label", "hreflang", "folder", "title")
    missing = [key for key in required if not entry.get(key)]
    if missing:
        raise ValueError(f"book_languages entry {name!r} needs {missing}")
    if source and entry.get("folder"):
        raise ValueError(f"the source language {name!r} has no folder, got "
                         f"{entry['folder']!r}")
    if entry.get("script") and entry["script"] not in SCRIPTS:
        raise ValueError(f"book_languages entry {name!r}: script {entry['script']!r} is not "
                         f"one of {sorted(SCRIPTS)}")
    if entry.get("search") and entry["search"] not in SEARCHES:
        raise ValueError(f"book_languages entry {name!r}: search {entry['search']!r} is not "
                         f"one of {SEARCHES}")
    if entry.get("font") and not entry.get("script"):
        raise ValueError(f"book_languages entry {name!r}: a font subsets a script: give "
                         "script too")
    if entry.get("termbase") and not entry.get("font"):
        raise ValueError(f"book_languages entry {name!r}: a termbase's font is cut from the "
                         "language's font: give font too")
    values = dict(entry)
    complete = values.get("complete", ())
    values["complete"] = complete if isinstance(complete, bool) else tuple(complete)
    values["exercise"] = dict(values.get("exercise") or {})
    if values.get("font"):
        values["font"] = Font(**values["font"])
    if values.get("termbase"):
        values["termbase"] = Termbase(**values["termbase"])
    return Language(**values)


def base_config(path: Path = CONFIG) -> dict[str, Any]:
    """The source edition's config (``_config.yml``), as a dict."""
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def languages(config: dict[str, Any] | None = None) -> list[Language]:
    """Every language of the book, the source first.

    Args:
        config: the book's config (default: ``_config.yml``'s).

    Returns:
        The parsed entries of ``sphinx.config.book_languages``.

    Raises:
        ValueError: if the list is empty, an entry is wrong, or two entries share a code or
            a folder.
    """
    config = config if config is not None else base_config()
    entries = ((config.get("sphinx") or {}).get("config") or {}).get("book_languages") or []
    if not entries:
        raise ValueError("_config.yml lists no book_languages under sphinx: config:")
    found = [parse(entry, source=index == 0) for index, entry in enumerate(entries)]
    for key in ("code", "edition"):
        names = [getattr(language, key) for language in found]
        if len(set(names)) != len(names):
            raise ValueError(f"book_languages: two entries share one {key}: {names}")
    return found


def source(config: dict[str, Any] | None = None) -> Language:
    """The source language (the first entry)."""
    return languages(config)[0]


def translations(config: dict[str, Any] | None = None) -> list[Language]:
    """The translated editions (every entry but the first)."""
    return languages(config)[1:]


def edition(name: str, config: dict[str, Any] | None = None) -> Language:
    """The language of an edition, by its name (``Language.edition``: ``en``, ``zh``).

    Raises:
        ValueError: naming the editions there are.
    """
    found = {language.edition: language for language in languages(config)}
    if name not in found:
        raise ValueError(f"edition must be one of {tuple(found)}, not {name!r}")
    return found[name]
