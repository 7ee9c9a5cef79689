"""The translated editions (``_build/html/<folder>``) in a real browser, offline, as
tests/test_browser.py drives the English one (same server, same Chromium, same rules on
console errors and requests off the machine).

Every page of every translated edition is loaded once (:func:`_crawl`), and every probe
below reads that load. On every page at 390 px, the accessibility gate (``axe_gate.py``:
no serious or critical violation, every rule); on every chapter page, its first screen (title,
lede, picture, objectives) at 390 × 844 and 1366 × 900.

On a sample of pages of every edition whose language has a ``script`` (``book_languages``):
the page loads clean, its math is typeset and its images load; every character of the script
is drawn with a font that has it (this machine has no system font for it, so the edition's own
subset font must serve them from the first layout on); the explorers' captions and control
names are in the script, and every control still moves the picture without a kernel (their
translated widget state is loaded by the same widget manager). The bigram search finds the
course's words (the Chinese edition's query is its data).
"""
from __future__ import annotations

import functools

import axe_gate
import pytest
import test_browser as english
from test_browser import (
    CHAPTER_PAGES,
    DESKTOP,
    FIRST_SCREEN_JS,
    PHONE,
    WIDGET_PAGES,
    _failure,
    _wait_for_images,
    _wait_for_widgets,
    drive_every_control,
    first_screen_problems,
)

from book_support import toc_docnames
from i18n import languages

server = english.server  # the English tests' fixtures: one local server, one Chromium
browser = english.browser
pytestmark = [pytest.mark.browser, pytest.mark.book]

SCRIPTED = [language for language in languages.translations() if language.script]
# A word of the course in each language with bigram search, and the page it must find.
QUERIES = {"zh_CN": ("注意力", "chapters/01_attention.html")}
# Chapter 2 (its second page): the explorer with a live part (text box, button, accordion);
# 5: RoPE's rotations; 7 (its second page): the largest widget state; with the introduction and the glossary (a table in two fonts).
SAMPLE = ["intro", "chapters/02b_encoder_decoder", "chapters/05_positional", "chapters/07b_serving",
          "appendix/glossary"]

# The width of every element whose own text has a letter of the script (LETTERS), as laid
# out now, keyed by its place in the page; drawn with a missing glyph a character takes
# another width.
_SCRIPT_WIDTHS = """letters => {
    const found = {};
    const pattern = new RegExp('[' + letters + ']');
    const all = document.querySelectorAll('body *');
    all.forEach((e, i) => {
        const own = Array.from(e.childNodes).filter(n => n.nodeType === 3)
            .map(n => n.textContent).join('');
        if (pattern.test(own) && e.getClientRects().length) {
            found[i] = Math.round(e.getBoundingClientRect().width * 10) / 10;
        }
    });
    return found;
}"""

_RELAYOUT = """() => {
    document.body.style.letterSpacing = '0.5px';
    void document.body.offsetHeight;
    document.body.style.letterSpacing = '';
    void document.body.offsetHeight;
}"""


def _draws_every_character(page, language) -> None:
    """The page is in ``language``, its math typeset and its images loaded, and every
    character of its script drawn with the edition's font from the first layout on."""
    letters = languages.LETTERS[language.script]
    assert not _wait_for_images(page)
    page.evaluate("() => document.fonts.ready")
    math = page.evaluate("""() => {
        const nodes = Array.from(document.querySelectorAll('.math'));
        return [nodes.length, nodes.filter(n => n.querySelector('mjx-container')).length];
    }""")
    assert math[0] == math[1], f"math not typeset: {math}"
    text = page.inner_text("main")
    assert len(language.letters().findall(text)) > 200, f"the page is not in {language.code}"
    if language.font:
        missing = page.evaluate("""([t, letters, family]) =>
            [...new Set(t.match(new RegExp('[' + letters + ']', 'g')))]
            .filter(c => !document.fonts.check(`16px "${family}"`, c))""",
                                [text, letters, language.font.family])
        assert not missing, f"characters the edition's font lacks: {''.join(missing)}"
    # Laid out once the font is there: a new layout changes no width (text drawn with
    # empty boxes before the font arrived would change).
    before = page.evaluate(_SCRIPT_WIDTHS, letters)
    page.evaluate(_RELAYOUT)
    after = page.evaluate(_SCRIPT_WIDTHS, letters)
    changed = {k: (before[k], after.get(k)) for k in before if before[k] != after.get(k)}
    assert before and not changed, f"text laid out before its font: {list(changed.items())[:5]}"


def _explorers_speak(page, language) -> None:
    """The first explorer's caption and control names are in ``language``'s script, and
    every control of the page moves its picture (:func:`test_browser.drive_every_control`)."""
    root = page.locator(".cell_output .widget-vbox:not(.widget-vbox .widget-vbox)").first
    caption = root.locator(".widget-html").first.inner_text()
    assert language.letters().search(caption), f"caption in English: {caption[:80]}"
    labels = root.locator(".widget-label").all_inner_texts()
    assert labels and any(language.letters().search(label) for label in labels), labels
    drive_every_control(page)


def _language(code: str):
    return next(language for language in languages.translations() if language.code == code)


@functools.lru_cache(maxsize=None)
def _crawl(base: str, code: str, docname: str, browser) -> dict:
    """Load ``docname`` of the edition in ``code`` once, at 390 × 844: the gate (every rule);
    on a chapter page its first screen there and at 1366 × 900; then, at 1366 px, on a page of
    ``SAMPLE`` in a language with a script, its text and font, and on a sample page with
    explorers, their words and controls. What each probe found wrong is kept (None: nothing),
    with the console errors and requests off the machine seen by then."""
    language = _language(code)
    page, problems = browser.open(f"{base}/{language.folder}/{docname}.html", viewport=PHONE)
    found = {}
    try:
        if docname in WIDGET_PAGES:
            _wait_for_widgets(page)
        axe_gate.settle(page)
        found["axe"] = axe_gate.violations(page, problems=problems)
        found["first_screen"] = []
        if docname in CHAPTER_PAGES:
            for size in (PHONE, DESKTOP):
                page.set_viewport_size(size)
                page.wait_for_timeout(200)
                found["first_screen"] += [
                    f"at {size['width']} px: {problem}" for problem in
                    first_screen_problems(page.evaluate(FIRST_SCREEN_JS), size["height"])]
        page.set_viewport_size(DESKTOP)
        axe_gate.settle(page)
        page.wait_for_timeout(600)  # the theme slides the sidebar in after the resize
        if language.script and docname in SAMPLE:
            found["characters"] = _failure(_draws_every_character, page, language)
            page.wait_for_timeout(300)  # late console messages
            found["characters_problems"] = list(problems)
        if language.script and docname in SAMPLE and docname in WIDGET_PAGES:
            found["explorers"] = _failure(_explorers_speak, page, language)
        found["problems"], found["outside"] = list(problems), list(browser.outside)
        return found
    finally:
        page.close()


_GATED = [(language, docname) for language in languages.translations()
          for docname in toc_docnames()]


@pytest.mark.parametrize("language, docname", _GATED,
                         ids=[f"{language.folder}/{docname}" for language, docname in _GATED])
def test_no_serious_accessibility_violation(server, browser, language, docname):
    """axe-core at 390 px: no violation of impact "serious" or "critical"."""
    found = _crawl(server, language.code, docname, browser)["axe"]
    if found is None:
        english._missing(axe_gate.MISSING)
    assert not found, f"{language.folder}/{docname}: {found}"


_CHAPTERS = [(language, docname) for language, docname in _GATED if docname in CHAPTER_PAGES]


@pytest.mark.parametrize("language, docname", _CHAPTERS,
                         ids=[f"{language.folder}/{docname}" for language, docname in _CHAPTERS])
def test_first_screen_shows_title_lede_picture_and_objectives(server, browser, language,
                                                              docname):
    """At 390 × 844 and 1366 × 900 a translated chapter page's first screen shows its title,
    its lede, a picture and the first line of its objectives."""
    found = _crawl(server, language.code, docname, browser)["first_screen"]
    assert not found, f"{language.folder}/{docname}: {found}"


_PAGES = [(language, docname) for language in SCRIPTED for docname in SAMPLE]


@pytest.mark.parametrize("language, docname", _PAGES,
                         ids=[f"{language.code}:{docname}" for language, docname in _PAGES])
def test_translated_page_loads_clean_and_draws_every_character(server, browser, language,
                                                               docname):
    found = _crawl(server, language.code, docname, browser)
    assert found["characters"] is None, found["characters"]
    assert not found["characters_problems"], "\n".join(found["characters_problems"])
    assert not found["outside"], f"requests that left the machine: {found['outside']}"


_EXPLORERS = [(language, docname) for language, docname in _PAGES if docname in WIDGET_PAGES]


@pytest.mark.parametrize("language, docname", _EXPLORERS,
                         ids=[f"{language.code}:{docname}" for language, docname in _EXPLORERS])
def test_translated_explorers_speak_the_language_and_respond(server, browser, language, docname):
    found = _crawl(server, language.code, docname, browser)
    assert found["explorers"] is None, found["explorers"]
    assert not found["problems"], "\n".join(found["problems"])


_SEARCHED = [language for language in languages.translations() if language.search == "bigram"]


@pytest.mark.parametrize("language", _SEARCHED, ids=[language.code for language in _SEARCHED])
def test_bigram_search_finds_the_courses_words(server, browser, language):
    query, expected = QUERIES[language.code]
    page, problems = browser.open(f"{server}/{language.folder}/search.html?q={query}")
    try:
        page.wait_for_function(
            "() => document.querySelectorAll('#search-results li').length >= 5", timeout=20000)
        links = page.eval_on_selector_all("#search-results li a", "els => els.map(e => e.href)")
        assert any(expected in link for link in links), links[:10]
        assert not problems, "\n".join(problems)
    finally:
        page.close()
