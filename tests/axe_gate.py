"""The accessibility gate's engine: axe-core (bundled by ``axe-playwright-python``) run in the
Chromium of ``test_browser.py`` on a page already loaded, reporting the violations of impact
"serious" or "critical".

The gate itself rides the browser crawls, one load per page, width and edition: every English
page at 1366 and 390 px (``test_browser.py``), every page of each translated edition at 390 px
(``test_browser_i18n.py``); ``test_accessibility.py`` checks that the gate sees a planted
violation. No rule is switched off; an element the gate must skip is named in ``EXCLUDED``
with the upstream issue that explains it (CONTRIBUTING.md lists them). Colour contrast, which
does not change with the width, is checked once per page and edition: three quarters of
axe's time on a page is that rule (every token of highlighted code and every glyph of a
formula is an element).
"""
from __future__ import annotations

import functools

BLOCKING = ("serious", "critical")
#: CSS selector -> why axe may not check it (the upstream issue). Empty: nothing is skipped.
EXCLUDED: dict[str, str] = {}
# Only the violations are collected (axe's passes and inapplicable rules are not serialised).
_OPTIONS = {"resultTypes": ["violations"]}
_WITHOUT_CONTRAST = {**_OPTIONS, "rules": {"color-contrast": {"enabled": False}}}

MISSING = "axe-playwright-python is not installed: pip install -r requirements.txt"


@functools.lru_cache(maxsize=1)
def engine():
    """axe-playwright-python's runner, or None where the package is missing."""
    try:
        from axe_playwright_python.sync_playwright import Axe
    except ImportError:
        return None
    return Axe()


def violations(page, *, contrast: bool = True, problems: list[str] | None = None
               ) -> list[str] | None:
    """The serious and critical violations on ``page`` as it is now, one line each (rule,
    impact, number of elements, help, first element); None without axe.

    ``problems`` (the page's console errors and failed requests, ``test_browser._Browser``)
    loses what axe itself caused: to read the style sheets, axe fetches them again and
    resolves their ``@import`` against the page instead of the sheet (a 404 for
    ``/basic.css``); the page made none of those requests."""
    axe = engine()
    if axe is None:
        return None
    context = {"exclude": [[selector] for selector in EXCLUDED]} if EXCLUDED else None
    seen = len(problems) if problems is not None else 0
    result = axe.run(page, context=context, options=_OPTIONS if contrast else _WITHOUT_CONTRAST)
    if problems is not None:
        del problems[seen:]
    return [f"{v['id']} ({v['impact']}, {len(v['nodes'])}): {v['help']}; first at "
            f"{v['nodes'][0]['target']}" for v in result.response["violations"]
            if v["impact"] in BLOCKING]


def settle(page) -> None:
    """Wait for the layout after a resize, and for book.js's marks of the boxes that scroll
    (on a busy machine 300 ms alone was not always enough)."""
    page.wait_for_timeout(300)
    page.evaluate("""() => new Promise(done => requestAnimationFrame(
        () => requestAnimationFrame(done)))""")
