"""The glossary's Chinese font holds exactly the glossary's characters, and the book uses it.

The Chinese entry of ``book_languages`` has a termbase: the glossary's column of Chinese terms,
with its font ``_assets/fonts/glossary-zh.woff``, Noto Sans SC cut down to the CJK characters
of ``appendix/glossary.md`` by ``python tools/i18n fonts``. A term added without regenerating
the font would show as empty boxes on a machine without a Chinese font: these tests fail
instead.
"""
from __future__ import annotations

import io
import re

import pytest
import yaml
from fontTools.ttLib import TTFont

from book_support import ROOT
from i18n import fonts as tool
from i18n import languages

CSS = ROOT / "_assets" / "book.css"
CHINESE = languages.edition("zh")  # the language whose termbase the glossary holds
GLOSSARY = ROOT / CHINESE.termbase.page
FONT = ROOT / CHINESE.termbase.font


@pytest.fixture(scope="module")
def glossary_characters() -> str:
    return tool.termbase_characters(CHINESE)


@pytest.fixture(scope="module")
def font() -> TTFont:
    return TTFont(FONT)


def test_glossary_has_chinese_terms(glossary_characters):
    assert [language.code for language in languages.translations() if language.termbase] \
        == [CHINESE.code]
    assert "注意力" in GLOSSARY.read_text(encoding="utf-8")
    assert len(glossary_characters) > 50
    # Characters outside the ranges would not get the font (CSS unicode-range): there are none.
    others = {ch for ch in GLOSSARY.read_text(encoding="utf-8") if ord(ch) > 0x2000
              and ch not in glossary_characters and ch not in "–—’“”…→−×√"}
    assert not others, f"characters the font ranges leave out: {sorted(others)}"


def test_every_glossary_character_is_in_the_font(glossary_characters, font):
    cmap = font.getBestCmap()
    missing = [ch for ch in glossary_characters if ord(ch) not in cmap]
    assert not missing, (f"the glossary font lacks {''.join(missing)}: run "
                         f"`python tools/i18n fonts`")


def test_font_holds_only_the_glossary_characters(glossary_characters, font):
    in_font = "".join(sorted(chr(cp) for cp in font.getBestCmap()))
    assert CHINESE.in_script(in_font) == glossary_characters, (
        "the glossary font has characters the glossary no longer uses: run "
        "`python tools/i18n fonts`")
    assert in_font == glossary_characters  # nothing else either


def test_font_is_small_and_licensed(font):
    size = FONT.stat().st_size
    assert size < 40 * 1024, f"{size / 1024:.0f} KiB"
    assert font.flavor == "woff"
    assert "Noto Sans SC" in font["name"].getDebugName(1)
    assert "scripts.sil.org/OFL" in font["name"].getDebugName(14)  # the licence URL record
    licence = (ROOT / CHINESE.font.licence).read_text(encoding="utf-8")
    assert "SIL Open Font License, Version 1.1" in licence
    readme = (ROOT / "_assets" / "README.md").read_text(encoding="utf-8")
    assert "@fontsource/noto-sans-sc" in readme and "5.3.0" in CHINESE.font.package


def test_subsetting_keeps_exactly_the_characters_asked_for():
    """The tool's subsetting, offline: from the shipped font, a smaller one."""
    smaller = TTFont(io.BytesIO(tool.subset_font(FONT, "注意力")))
    assert sorted(smaller.getBestCmap()) == sorted(map(ord, "注意力"))
    with pytest.raises(ValueError, match="猫"):
        tool.subset_font(FONT, "注意猫")
    assert tool.subset_font(FONT, "注意力") == tool.subset_font(FONT, "注意力")


def _unicode_ranges(css: str) -> list[tuple[int, int]]:
    block = re.search(r"unicode-range:([^;]+);", css).group(1)
    ranges = []
    for part in block.split(","):
        lo, _, hi = part.strip().removeprefix("U+").partition("-")
        ranges.append((int(lo, 16), int(hi or lo, 16)))
    return ranges


def test_book_css_applies_the_font_to_the_glossary_column(glossary_characters):
    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    assert "book.css" in config["sphinx"]["config"]["html_css_files"]
    css = CSS.read_text(encoding="utf-8")
    face = re.search(r"@font-face\s*{([^}]*)}", css).group(1)
    family = re.search(r'font-family:\s*"([^"]+)"', face).group(1)
    url = re.search(r'url\("([^"]+)"\)', face).group(1)
    assert (CSS.parent / url).resolve() == FONT.resolve()
    ranges = _unicode_ranges(face)
    assert ranges == languages.SCRIPTS[CHINESE.script]
    assert all(any(lo <= ord(ch) <= hi for lo, hi in ranges) for ch in glossary_characters)
    assert re.search(r"table\.glossary td:nth-child\(2\)[^{]*{\s*font-family:\s*\"" + family, css)
    glossary = GLOSSARY.read_text(encoding="utf-8")
    assert re.search(r"```{table}\n:class: glossary\n\n\| term \| 中文 \| meaning \|", glossary)
    assert f"| {CHINESE.termbase.column} |" in glossary
