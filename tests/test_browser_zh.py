"""The Chinese edition (``_build/html/zh``) in a real browser, offline, as tests/test_browser.py
drives the English one (same server, same Chromium, same rules on console errors and requests
off the machine).

On a sample of Chinese pages: the page loads clean, its math is typeset and its images load;
every Chinese character is drawn with a font that has it (this machine has no system Chinese
font, so the book's own subset font must serve them from the first layout on); the explorers'
captions and control names are Chinese, and every control still moves the picture without a
kernel (their translated widget state is loaded by the same widget manager). Search finds
Chinese words.
"""
from __future__ import annotations

import re

import pytest
import test_browser as english
from test_browser import _wait_for_images, _wait_for_widgets, drive_every_control

server = english.server  # the English tests' fixtures: one local server, one Chromium
browser = english.browser
pytestmark = [pytest.mark.browser, pytest.mark.book]

_HAN = re.compile(r"[\u4e00-\u9fff]")
# Chapter 2: the explorer with a live part (text box, button, accordion); 5: RoPE's rotations;
# 7: the largest widget state; with the introduction and the glossary (a table in two fonts).
SAMPLE = ["intro", "chapters/02_qkv_roles", "chapters/05_positional", "chapters/07_kv_cache",
          "appendix/glossary"]

# The width of every element whose own text has a Chinese character, as laid out now, keyed by
# its place in the page; drawn with a missing glyph a character takes another width.
_CJK_WIDTHS = """() => {
    const found = {};
    const all = document.querySelectorAll('body *');
    all.forEach((e, i) => {
        const own = Array.from(e.childNodes).filter(n => n.nodeType === 3)
            .map(n => n.textContent).join('');
        if (/[\\u4e00-\\u9fff]/.test(own) && e.getClientRects().length) {
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


@pytest.mark.parametrize("docname", SAMPLE)
def test_chinese_page_loads_clean_and_draws_every_character(server, browser, docname):
    page, problems = browser.open(f"{server}/zh/{docname}.html")
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
        assert len(_HAN.findall(text)) > 200, "the page is not in Chinese"
        missing = page.evaluate("""t => [...new Set(t.match(/[\\u4e00-\\u9fff]/g))]
            .filter(c => !document.fonts.check('16px "Book Noto Sans SC"', c))""", text)
        assert not missing, f"characters the edition's font lacks: {''.join(missing)}"
        # Laid out once the font is there: a new layout changes no width (text drawn with
        # empty boxes before the font arrived would change).
        before = page.evaluate(_CJK_WIDTHS)
        page.evaluate(_RELAYOUT)
        after = page.evaluate(_CJK_WIDTHS)
        changed = {k: (before[k], after.get(k)) for k in before if before[k] != after.get(k)}
        assert before and not changed, f"text laid out before its font: {list(changed.items())[:5]}"
        page.wait_for_timeout(300)
        assert not problems, "\n".join(problems)
        assert not browser.outside, f"requests that left the machine: {browser.outside}"
    finally:
        page.close()


@pytest.mark.parametrize("docname", [d for d in SAMPLE if d.startswith("chapters/")])
def test_chinese_explorers_speak_chinese_and_respond(server, browser, docname):
    page, problems = browser.open(f"{server}/zh/{docname}.html")
    try:
        _wait_for_widgets(page)
        root = page.locator(".cell_output .widget-vbox:not(.widget-vbox .widget-vbox)").first
        caption = root.locator(".widget-html").first.inner_text()
        assert _HAN.search(caption), f"caption in English: {caption[:80]}"
        labels = root.locator(".widget-label").all_inner_texts()
        assert labels and any(_HAN.search(label) for label in labels), labels
        drive_every_control(page)
        assert not problems, "\n".join(problems)
    finally:
        page.close()


def test_chinese_search_finds_chinese_words(server, browser):
    page, problems = browser.open(f"{server}/zh/search.html?q=注意力")
    try:
        page.wait_for_function(
            "() => document.querySelectorAll('#search-results li').length >= 5", timeout=20000)
        links = page.eval_on_selector_all("#search-results li a", "els => els.map(e => e.href)")
        assert any("chapters/01_attention.html" in link for link in links), links[:10]
        assert not problems, "\n".join(problems)
    finally:
        page.close()
