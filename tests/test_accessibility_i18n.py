"""The accessibility gate on every page of each translated edition, at 390 px: the checks of
``test_accessibility.py`` (a file of its own, so that the parallel workers share the gate)."""
from __future__ import annotations

import pytest
import test_accessibility as gate

server, browser, axe = gate.server, gate.browser, gate.axe  # its fixtures
pytestmark = [pytest.mark.browser, pytest.mark.book]


@pytest.mark.parametrize("edition, docname, widths", gate.TRANSLATED_PAGES,
                         ids=[f"{e}/{d}" for e, d, _ in gate.TRANSLATED_PAGES])
def test_no_serious_accessibility_violation(server, browser, axe, edition, docname, widths):
    gate.check_page(server, browser, axe, edition, docname, widths)
