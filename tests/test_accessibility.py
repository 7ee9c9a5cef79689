"""The accessibility gate: axe-core on every page of the built book, English at 1366 and 390 px
(here) and every translated edition at 390 px (``test_accessibility_i18n.py``), with no
violation of impact "serious" or "critical".

``axe-playwright-python`` bundles axe-core and runs it in the Chromium of ``test_browser.py``
(its fixtures: one local server, one browser, requests off the machine blocked). No rule is
switched off; an element the gate must skip is named in ``EXCLUDED`` with the upstream issue
that explains it (CONTRIBUTING.md lists them). The page is checked once explorers have drawn
and MathJax has typeset, so the widgets' and the formulas' markup is what axe sees; colour
contrast, which does not change with the width, once per page and edition (``_ONCE``).
"""
from __future__ import annotations

import pytest
import test_browser as english
from test_browser import (
    CHAPTER_PAGES,
    FIRST_SCREEN_JS,
    _wait_for_widgets,
    first_screen_problems,
)

from book_support import toc_docnames
from i18n import languages

server = english.server  # the English tests' fixtures: one local server, one Chromium
browser = english.browser
pytestmark = [pytest.mark.browser, pytest.mark.book]

DESKTOP = {"width": 1366, "height": 900}
PHONE = {"width": 390, "height": 844}
BLOCKING = ("serious", "critical")
#: CSS selector -> why axe may not check it (the upstream issue). Empty: nothing is skipped.
EXCLUDED: dict[str, str] = {}

# (edition, page, widths): an English page is checked at both widths in one load. The
# translated editions are checked by test_accessibility_i18n.py (a file of its own, so that
# the parallel workers share the gate).
_PAGES = [("en", docname, ("desktop", "phone")) for docname in toc_docnames()]
TRANSLATED_PAGES = [(language.folder, docname, ("phone",))
                    for language in languages.translations() for docname in toc_docnames()]
# Only the violations are collected (axe's passes and inapplicable rules are not serialised).
_OPTIONS = {"resultTypes": ["violations"]}
# Colour contrast is three quarters of axe's time on a page (every token of highlighted code
# and every glyph of a formula is an element) and does not depend on the width: a page is
# checked for it once per edition, at its first width, and for every other rule at each.
_ONCE = {"rules": {"color-contrast": {"enabled": False}}}


@pytest.fixture(scope="module")
def axe():
    try:
        from axe_playwright_python.sync_playwright import Axe
    except ImportError:
        english._missing("axe-playwright-python is not installed: pip install -r requirements.txt")
    return Axe()


def _violations(axe, page, *, contrast: bool = True) -> list[str]:
    context = {"exclude": [[selector] for selector in EXCLUDED]} if EXCLUDED else None
    result = axe.run(page, context=context, options=_OPTIONS if contrast else {**_OPTIONS, **_ONCE})
    return [f"{v['id']} ({v['impact']}, {len(v['nodes'])}): {v['help']}; first at "
            f"{v['nodes'][0]['target']}" for v in result.response["violations"]
            if v["impact"] in BLOCKING]


def check_page(server, browser, axe, edition: str, docname: str, widths: tuple[str, ...]):
    """Load ``docname`` of ``edition`` once and fail on any serious or critical violation at
    each of ``widths``; a translated chapter page also on a first screen (at 390 × 844 and
    1366 × 900) without its title, lede, picture and objectives."""
    folder = "" if edition == "en" else f"{edition}/"
    page, _ = browser.open(f"{server}/{folder}{docname}.html")
    try:
        if page.locator('script[type="application/vnd.jupyter.widget-state+json"]').count():
            _wait_for_widgets(page)
        found = []
        for width in widths:
            page.set_viewport_size(DESKTOP if width == "desktop" else PHONE)
            page.wait_for_timeout(300)  # the layout, and book.js's marks, after the resize
            # book.js marks the boxes that scroll in the frame after a resize: wait for it
            # (on a busy machine 300 ms was not always enough).
            page.evaluate("""() => new Promise(done => requestAnimationFrame(
                () => requestAnimationFrame(done)))""")
            found += [f"at {width}: {v}"
                      for v in _violations(axe, page, contrast=width == widths[0])]
        if edition != "en" and docname in CHAPTER_PAGES:
            # The same load serves the translated edition's first-screen probe (the English
            # one is in test_browser.py's crawls): title, lede, picture and objectives.
            for size in (PHONE, DESKTOP):
                page.set_viewport_size(size)
                page.wait_for_timeout(200)
                found += [f"first screen at {size['width']} px: {problem}" for problem in
                          first_screen_problems(page.evaluate(FIRST_SCREEN_JS), size["height"])]
        assert not found, f"{folder}{docname}:\n" + "\n".join(found)
    finally:
        page.close()


@pytest.mark.parametrize("edition, docname, widths", _PAGES,
                         ids=[f"{e}/{d}@{'+'.join(w)}" for e, d, w in _PAGES])
def test_no_serious_accessibility_violation(server, browser, axe, edition, docname, widths):
    check_page(server, browser, axe, edition, docname, widths)


def test_the_gate_sees_a_violation(server, browser, axe):
    """The gate is not blind: an image without alt text planted in a page is reported."""
    page, _ = browser.open(f"{server}/intro.html")
    try:
        page.evaluate("""() => {
            const img = document.createElement('img');
            img.src = '_static/logo.svg';
            document.querySelector('main').appendChild(img);
        }""")
        assert any(v.startswith("image-alt") for v in _violations(axe, page))
    finally:
        page.close()
