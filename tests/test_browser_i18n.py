"""The translated editions (``_build/html/<folder>``) in a real browser, offline, as
tests/test_browser.py drives the English one (same server, same Chromium, same rules on
console errors and requests off the machine).

On a sample of pages of every edition whose language has a ``script`` (``book_languages``):
the page loads clean, its math is typeset and its images load; every character of the script
is drawn with a font that has it (this machine has no system font for it, so the edition's own
subset font must serve them from the first layout on); the explorers' captions and control
names are in the script, and every control still moves the picture without a kernel (their
translated widget state is loaded by the same widget manager). The bigram search finds the
course's words (the Chinese edition's query is its data). The first screen of every translated
chapter page is checked by the accessibility gate's load of that page
(``test_accessibility.check_page``).
"""
from __future__ import annotations

import pytest
import test_browser as english
from test_browser import (
    _wait_for_images,
    _wait_for_widgets,
    drive_every_control,
)

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


_PAGES = [(language, docname) for language in SCRIPTED for docname in SAMPLE]


@pytest.mark.parametrize("language, docname", _PAGES,
                         ids=[f"{language.code}:{docname}" for language, docname in _PAGES])
def test_translated_page_loads_clean_and_draws_every_character(server, browser, language,
                                                               docname):
    page, problems = browser.open(f"{server}/{language.folder}/{docname}.html")
    letters = languages.LETTERS[language.script]
    try:
        if docname.startswith("chapters/"):
            _wait_for_widgets(page)
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
        page.wait_for_timeout(300)
        assert not problems, "\n".join(problems)
        assert not browser.outside, f"requests that left the machine: {browser.outside}"
    finally:
        page.close()


_EXPLORERS = [(language, docname) for language, docname in _PAGES if docname.startswith("chapters/")]


@pytest.mark.parametrize("language, docname", _EXPLORERS,
                         ids=[f"{language.code}:{docname}" for language, docname in _EXPLORERS])
def test_translated_explorers_speak_the_language_and_respond(server, browser, language, docname):
    page, problems = browser.open(f"{server}/{language.folder}/{docname}.html")
    try:
        _wait_for_widgets(page)
        root = page.locator(".cell_output .widget-vbox:not(.widget-vbox .widget-vbox)").first
        caption = root.locator(".widget-html").first.inner_text()
        assert language.letters().search(caption), f"caption in English: {caption[:80]}"
        labels = root.locator(".widget-label").all_inner_texts()
        assert labels and any(language.letters().search(label) for label in labels), labels
        drive_every_control(page)
        assert not problems, "\n".join(problems)
    finally:
        page.close()


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
