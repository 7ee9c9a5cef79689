"""The accessibility gate is not blind: axe-core, as ``axe_gate.py`` runs it on every page
(the crawls of ``test_browser.py`` and ``test_browser_i18n.py``), reports a planted image
without alt text."""
from __future__ import annotations

import axe_gate
import pytest
import test_browser as english

server = english.server  # the English tests' fixtures: one local server, one Chromium
browser = english.browser
pytestmark = [pytest.mark.browser, pytest.mark.book]


def test_the_gate_sees_a_violation(server, browser):
    page, _ = browser.open(f"{server}/intro.html")
    try:
        page.evaluate("""() => {
            const img = document.createElement('img');
            img.src = '_static/logo.svg';
            document.querySelector('main').appendChild(img);
        }""")
        found = axe_gate.violations(page)
        if found is None:
            english._missing(axe_gate.MISSING)
        assert any(v.startswith("image-alt") for v in found), found
    finally:
        page.close()
